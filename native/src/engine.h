// The inference engine: continuous batching over a token-slot KV pool with a radix prefix cache, and
// LoRA adapters over the base served per request, mixed in one batch.
// Plain C++ (no N-API): engine_napi.cc wraps it for JavaScript and runs step() off the event loop.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "forward.h"
#include "lora.h"
#include "model.h"
#include "radix_cache.h"
#include "sampling.h"

namespace ooze {

/** One sampled token (or, with token -1, a request dropped for lack of KV memory). */
struct EngineEvent {
  enum Finish { None = 0, Stop = 1, Length = 2, Abort = 3 };
  std::string rid;
  int token = -1;
  float logprob = 0;
  Finish finish = None;
  int finish_value = 0;  // Stop: the matched token id; Length: tokens generated
  std::string message;   // Abort: why
  uint64_t serial = 0;   // the request's serial (rids can be reused after abort)
};

/** Prefix-cache figures for cacheStats(). */
struct EngineCacheStats {
  size_t cached_tokens = 0, budget_tokens = 0;
  uint64_t prompt_tokens = 0, hit_tokens = 0;
  size_t free_slots = 0;  // KV slots held by nobody (pool = free + cached + held by requests)
};

/**
 * What the engine serves under a name besides the base: a LoRA adapter over the base, or a whole
 * model of the base's architecture (a policy of its own weights: `model` set, `lora` empty).
 * Immutable once loaded: a reload of its name makes a new one (a new id), and requests keep the one
 * they were added with until they end.
 */
struct EngineAdapter {
  std::string name;
  uint64_t id;  // unique per load; names the adapter's prefix cache
  Lora lora;
  LoraView view;  // into lora.params
  std::shared_ptr<const Model> model;  // a named whole model; null: the LoRA adapter over the base
  EngineAdapter(std::string n, uint64_t i, Lora a) : name(std::move(n)), id(i), lora(std::move(a)), view(LoraView::of(lora)) {}
  EngineAdapter(std::string n, uint64_t i, Model m)
      : name(std::move(n)), id(i), model(std::make_shared<const Model>(std::move(m))) {}
  EngineAdapter(const EngineAdapter&) = delete;
  EngineAdapter& operator=(const EngineAdapter&) = delete;
};

/**
 * Requests are added at any time (add/abort/running/flush/stats are cheap and thread-safe);
 * step() admits waiting requests while there are running places and KV slots, runs prefill for the
 * newly admitted and one decode token for the others in one batched forward, samples, and returns
 * the events. The KV cache is a pool of `pool_tokens` slots; each request holds a list of slot ids
 * (the prefix-cache hit's slots first), so finished sequences are handed to the radix cache as-is.
 *
 * Adapters: each request runs under the base or one loaded adapter. Keys/values depend on the
 * adapter, so each adapter load has its own radix tree over the shared slot pool (the base has
 * tree 0): a prefix is only ever reused under the adapter that computed it. When slots run short,
 * trees of unloaded or replaced adapters are emptied first, then the least recently used trees
 * (LRU by tree, then by leaf within it).
 */
class Engine {
 public:
  Engine(Model model, int pool_tokens, int max_running);

  const LlamaConfig& config() const { return model_.cfg; }
  /**
   * Admits a request under `adapter` ("" = the base); returns its prompt tokens served from the
   * prefix cache. Throws std::invalid_argument (bad prompt, duplicate rid, adapter not loaded).
   */
  int add(const std::string& rid, std::vector<int32_t> prompt, const SamplingParams& sp, const std::string& adapter = "");
  /**
   * Loads `lora` as adapter `name`; returns true when it replaced an adapter of that name (requests
   * added before keep the old one, and its cached prefixes are never reused). Throws
   * std::invalid_argument when the name is empty or the adapter's layout does not fit the base.
   */
  bool load_adapter(const std::string& name, Lora lora);
  /**
   * Loads a whole model as `name` (served like an adapter: requests name it, it has its own prefix
   * cache); its config must be the base's architecture. Returns true when it replaced a loaded name.
   */
  bool load_model(const std::string& name, Model model);
  /** Unloads adapter `name` (running requests finish with it; its cached prefixes go). False if not loaded. */
  bool unload_adapter(const std::string& name);
  /** The loaded adapters, by name. */
  std::vector<std::shared_ptr<const EngineAdapter>> adapters();
  /** Drops a request (its computed prefix goes into the prefix cache). Unknown rids are ignored. */
  void abort(const std::string& rid);
  /**
   * One scheduling iteration; call from one thread at a time (it serialises itself anyway). Pass
   * its events through deliver() before handing them out.
   */
  std::vector<EngineEvent> step();
  /**
   * Drops the events of requests aborted after their step computed them (the step ran while the
   * abort came in), so an aborted rid never yields another event. Call once per step() result.
   */
  void deliver(std::vector<EngineEvent>& events);
  /** Requests added and not finished (waiting or running). */
  size_t running();
  /** Empties the prefix cache; false (nothing flushed) while a request holds a cached prefix. */
  bool flush_cache();
  EngineCacheStats cache_stats();
  /**
   * Replaces the weights (same config required; throws std::invalid_argument otherwise) and flushes the
   * cache. With keep_cache the cached prefixes stay and are reused under the new weights (SGLang's
   * flush_cache false: the caller accepts keys and values computed by the old ones).
   */
  void load_weights(Model&& model, bool keep_cache = false);
  /** Logits [n, vocab] of every position of `tokens` under `adapter` ("" = base) without touching the cache (tests). */
  std::vector<float> forward_logits(const std::vector<int32_t>& tokens, const std::string& adapter = "");

 private:
  struct Request {
    std::string rid;
    uint64_t serial = 0;
    std::vector<int32_t> tokens;  // prompt, then every sampled token
    int prompt_len = 0;
    int n_gen = 0;
    int fed = 0;      // leading tokens whose keys/values are in `slots`
    int max_fed = 0;  // most tokens this request will ever feed
    int cached = 0;   // leading slots owned by the prefix cache (locked through `node`)
    RadixCache::NodeId node = 0;
    std::vector<int32_t> slots;
    SamplingParams sp;
    Rng rng;
    bool admitted = false, in_batch = false, aborted = false;
    bool stale = false;  // running across a weight reload: its keys/values mix old and new weights
    std::shared_ptr<const EngineAdapter> adapter;  // null: the base
    uint64_t cache_id = 0;                         // its prefix cache: the adapter's id, 0 for the base
  };

  /** One radix tree of the prefix cache: the base's (id 0) or one adapter load's. */
  struct PrefixCache {
    std::unique_ptr<RadixCache> tree;
    uint64_t last_use = 0;
    bool retired = false;  // its adapter was unloaded or replaced: never matched again, dropped when unpinned
  };

  bool ensure_free(size_t n);       // evicts from the prefix cache until n slots are free
  void unpin_waiting();             // drops the prefix hits of waiting requests (deadlock escape)
  void release(Request* r);         // hands slots to the cache / free list and forgets r
  void share_prompt(Request* r);    // after prefill: puts the prompt in the cache, pinned by r
  bool finished(Request& r, EngineEvent& ev) const;
  const Model& model_of(const Request* r) const;     // the base, or the named whole model r runs on
  void forward_batch(const std::vector<Request*>& batch, const std::vector<SeqChunk>& chunks);  // logits_ per batch row
  RadixCache& tree(const Request* r);                // r's prefix cache (it exists while r pins a prefix in it)
  PrefixCache* cache_of(const Request* r);           // r's prefix cache, or null once a retired one is gone
  void new_cache(uint64_t id);
  void retire_cache(uint64_t id);                    // empties what is unpinned; the rest when unpinned
  void drop_if_idle(uint64_t id);                    // erases a retired cache once nothing pins it
  void flush_unpinned();                             // after a weight reload: flush every tree that can be
  std::shared_ptr<const EngineAdapter> find_adapter(const std::string& name, const std::string& who);
  bool install(const std::string& name, std::function<std::shared_ptr<const EngineAdapter>(uint64_t id)> make);

  std::mutex mu_;          // requests, queue, free list, prefix cache
  std::mutex compute_mu_;  // one step / weight load / debug forward at a time
  Model model_;
  RopeTable rope_;
  KvPool kv_;
  Workspace ws_;
  std::vector<float> logits_;
  std::vector<float> part_logits_;  // one named model's rows of a mixed batch
  int max_running_;
  std::vector<int32_t> free_slots_;
  std::unordered_map<uint64_t, PrefixCache> caches_;  // by adapter id; 0 = the base
  std::unordered_map<std::string, std::shared_ptr<const EngineAdapter>> adapters_;
  uint64_t next_adapter_id_ = 1, cache_tick_ = 0;
  std::unordered_map<std::string, std::unique_ptr<Request>> reqs_;
  std::vector<std::unique_ptr<Request>> aborted_;  // aborted during a step in flight, not yet released
  std::deque<Request*> waiting_;
  std::vector<Request*> active_;
  uint64_t prompt_tokens_ = 0, hit_tokens_ = 0;
  uint64_t next_serial_ = 1;
  int stale_pins_ = 0;  // stale requests still pinning cached prefixes (no cache use until 0)
  int undelivered_ = 0;                         // step() results not yet through deliver()
  std::unordered_set<uint64_t> aborted_serials_;  // aborted while a result was undelivered
};

}  // namespace ooze
