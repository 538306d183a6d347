// The inference engine (see engine.h): admission against the KV slot pool and the radix prefix cache,
// batched prefill + decode through forward_step, sampling, hand-back of finished sequences, and the
// adapter registry with one prefix-cache tree per adapter load.
#include "engine.h"

#include <algorithm>
#include <stdexcept>

namespace ooze {

/** Most prompt tokens prefilled in one step (bounds the step's activations and its latency). */
constexpr size_t kMaxPrefillRows = 4096;

Engine::Engine(Model model, int pool_tokens, int max_running)
    : model_(std::move(model)), max_running_(std::max(1, max_running)) {
  const LlamaConfig& c = model_.cfg;
  const int pool = std::max(pool_tokens, c.max_position_embeddings);
  rope_.init(c);
  kv_.init(c.num_hidden_layers, pool, c.kv_dim());
  free_slots_.reserve(pool);
  for (int s = pool - 1; s >= 0; --s) free_slots_.push_back(s);
  new_cache(0);
}

void Engine::new_cache(uint64_t id) {
  // Every slot is free, held by a request, or held by one tree, so a budget of the whole pool
  // means insert() never has to drop tokens it was given.
  PrefixCache& c = caches_[id];
  c.tree = std::make_unique<RadixCache>(static_cast<size_t>(kv_.slots), [this](const int32_t* s, size_t n) {
    free_slots_.insert(free_slots_.end(), s, s + n);
  });
  c.last_use = ++cache_tick_;
}

RadixCache& Engine::tree(const Request* r) { return *caches_.at(r->cache_id).tree; }

Engine::PrefixCache* Engine::cache_of(const Request* r) {
  auto it = caches_.find(r->cache_id);
  return it == caches_.end() ? nullptr : &it->second;
}

void Engine::retire_cache(uint64_t id) {
  PrefixCache& c = caches_.at(id);
  c.retired = true;
  c.tree->evict(c.tree->size());
  drop_if_idle(id);
}

void Engine::drop_if_idle(uint64_t id) {
  auto it = caches_.find(id);
  if (it != caches_.end() && it->second.retired && it->second.tree->flush()) caches_.erase(it);
}

void Engine::flush_unpinned() {
  for (auto it = caches_.begin(); it != caches_.end();) {
    RadixCache& t = *it->second.tree;
    if (!t.flush()) t.evict(t.size());
    else if (it->second.retired) {
      it = caches_.erase(it);
      continue;
    }
    ++it;
  }
}

std::shared_ptr<const EngineAdapter> Engine::find_adapter(const std::string& name, const std::string& who) {
  if (name.empty()) return nullptr;
  auto it = adapters_.find(name);
  if (it != adapters_.end()) return it->second;
  std::string loaded;
  for (auto& [n, a] : adapters_) loaded += (loaded.empty() ? "" : ", ") + n;
  throw std::invalid_argument(who + "LoRA adapter '" + name + "' is not loaded (" +
                              (loaded.empty() ? "no adapters are loaded" : "loaded: " + loaded) + ")");
}

/** Whether a model of config `b` can stand in for one of config `a` (same tensors, same positions and tokens). */
static bool same_architecture(const LlamaConfig& a, const LlamaConfig& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers && a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.tie_word_embeddings == b.tie_word_embeddings &&
         a.max_position_embeddings == b.max_position_embeddings && a.rope_theta == b.rope_theta &&
         a.rope_scaling == b.rope_scaling && a.family == b.family && a.head_dim() == b.head_dim() &&
         a.qkv_bias == b.qkv_bias && a.o_bias == b.o_bias && a.qk_norm == b.qk_norm && a.sliding_window == b.sliding_window &&
         a.rms_norm_eps == b.rms_norm_eps && a.eos_token_id == b.eos_token_id;
}

bool Engine::install(const std::string& name, std::function<std::shared_ptr<const EngineAdapter>(uint64_t id)> make) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t id = next_adapter_id_++;
  auto a = make(id);
  new_cache(id);
  auto it = adapters_.find(name);
  const bool replaced = it != adapters_.end();
  if (replaced) {
    const uint64_t old = it->second->id;
    it->second = std::move(a);
    retire_cache(old);
  } else {
    adapters_.emplace(name, std::move(a));
  }
  return replaced;
}

bool Engine::load_adapter(const std::string& name, Lora lora) {
  if (name.empty()) throw std::invalid_argument("an adapter needs a non-empty name");
  const Lora want = make_lora(model_.cfg, lora.cfg);  // validates the config
  bool fits = lora.layers == want.layers && lora.params.size() == want.params.size() && lora.tensors.size() == want.tensors.size();
  for (size_t i = 0; fits && i < want.tensors.size(); ++i)
    fits = lora.tensors[i].name == want.tensors[i].name && lora.tensors[i].shape == want.tensors[i].shape &&
           lora.tensors[i].offset == want.tensors[i].offset;
  if (!fits)
    throw std::invalid_argument("adapter '" + name + "': its tensor layout does not fit the base model (" +
                                std::to_string(model_.cfg.num_hidden_layers) + " layers, hidden " +
                                std::to_string(model_.cfg.hidden_size) + ")");
  return install(name, [&](uint64_t id) { return std::make_shared<const EngineAdapter>(name, id, std::move(lora)); });
}

bool Engine::load_model(const std::string& name, Model model) {
  if (name.empty()) throw std::invalid_argument("a named model needs a non-empty name");
  if (!same_architecture(model_.cfg, model.cfg))
    throw std::invalid_argument("model '" + name + "': its config differs from the base model's (" +
                                std::to_string(model_.cfg.num_hidden_layers) + " layers, hidden " +
                                std::to_string(model_.cfg.hidden_size) + ", vocab " + std::to_string(model_.cfg.vocab_size) +
                                "): one engine serves models of one architecture");
  return install(name, [&](uint64_t id) { return std::make_shared<const EngineAdapter>(name, id, std::move(model)); });
}

bool Engine::unload_adapter(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = adapters_.find(name);
  if (it == adapters_.end()) return false;
  const uint64_t id = it->second->id;
  adapters_.erase(it);
  retire_cache(id);
  return true;
}

std::vector<std::shared_ptr<const EngineAdapter>> Engine::adapters() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::shared_ptr<const EngineAdapter>> out;
  for (auto& [n, a] : adapters_) out.push_back(a);
  std::sort(out.begin(), out.end(), [](auto& x, auto& y) { return x->name < y->name; });
  return out;
}

int Engine::add(const std::string& rid, std::vector<int32_t> prompt, const SamplingParams& sp, const std::string& adapter) {
  const LlamaConfig& c = model_.cfg;
  const int n = static_cast<int>(prompt.size());
  if (n == 0) throw std::invalid_argument("request '" + rid + "': input_ids is empty");
  if (n > c.max_position_embeddings)
    throw std::invalid_argument("request '" + rid + "': prompt of " + std::to_string(n) +
                                " tokens is longer than the context (" + std::to_string(c.max_position_embeddings) + ")");
  for (int32_t t : prompt)
    if (t < 0 || t >= c.vocab_size)
      throw std::invalid_argument("request '" + rid + "': token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                                  std::to_string(c.vocab_size - 1) + ")");
  std::lock_guard<std::mutex> lk(mu_);
  if (reqs_.count(rid)) throw std::invalid_argument("request '" + rid + "' is already running");
  std::shared_ptr<const EngineAdapter> a = find_adapter(adapter, "request '" + rid + "': ");
  auto r = std::make_unique<Request>();
  r->adapter = a;
  r->cache_id = a ? a->id : 0;
  r->rid = rid;
  r->serial = next_serial_++;
  r->prompt_len = n;
  r->tokens = std::move(prompt);
  r->sp = sp;
  r->rng = Rng(sp.seed);
  const int max_new = sp.max_new_tokens < 0 ? c.max_position_embeddings : std::max(1, sp.max_new_tokens);
  r->max_fed = std::min(n + max_new - 1, c.max_position_embeddings);
  // Leave the last prompt token uncached: its logits give the first sampled token. No reuse while
  // prefixes from before a weight reload are still pinned. Only the adapter's own tree is searched.
  RadixCache::Match m{0, {}, 0};
  PrefixCache& pc = caches_.at(r->cache_id);
  pc.last_use = ++cache_tick_;
  if (stale_pins_ == 0) m = pc.tree->match(r->tokens.data(), static_cast<size_t>(n - 1));
  if (m.length > 0) {
    pc.tree->lock(m.node);
    r->node = m.node;
    r->cached = static_cast<int>(m.length);
    r->slots = std::move(m.slots);
    r->fed = r->cached;
  }
  prompt_tokens_ += n;
  hit_tokens_ += r->cached;
  waiting_.push_back(r.get());
  const int cached = r->cached;
  reqs_.emplace(rid, std::move(r));
  return cached;
}

void Engine::abort(const std::string& rid) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = reqs_.find(rid);
  if (it == reqs_.end()) return;
  Request* r = it->second.get();
  if (undelivered_ > 0) aborted_serials_.insert(r->serial);
  if (r->in_batch) {
    // The step in flight releases it; the rid is free for a new request at once.
    r->aborted = true;
    aborted_.push_back(std::move(it->second));
    reqs_.erase(it);
  } else {
    release(r);
  }
}

size_t Engine::running() {
  std::lock_guard<std::mutex> lk(mu_);
  return reqs_.size();
}

bool Engine::flush_cache() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [id, c] : caches_)
    if (c.tree->locked_tokens() > 0) return false;  // all or nothing
  flush_unpinned();
  return true;
}

EngineCacheStats Engine::cache_stats() {
  std::lock_guard<std::mutex> lk(mu_);
  size_t cached = 0;
  for (auto& [id, c] : caches_) cached += c.tree->size();
  return {cached, static_cast<size_t>(kv_.slots), prompt_tokens_, hit_tokens_, free_slots_.size()};
}

bool Engine::ensure_free(size_t n) {
  if (free_slots_.size() >= n) return true;
  // Retired trees first (nothing can reuse them), then the least recently used trees.
  std::vector<std::pair<uint64_t, RadixCache*>> order;
  for (auto& [id, c] : caches_) order.emplace_back(c.retired ? 0 : c.last_use, c.tree.get());
  std::sort(order.begin(), order.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& [use, t] : order) {
    if (free_slots_.size() >= n) break;
    t->evict(n - free_slots_.size());
  }
  return free_slots_.size() >= n;
}

void Engine::unpin_waiting() {
  for (Request* r : waiting_) {
    if (r->cached == 0) continue;
    tree(r).unlock(r->node);
    r->node = 0;
    r->cached = 0;
    r->fed = 0;
    r->slots.clear();
    drop_if_idle(r->cache_id);
  }
}

void Engine::release(Request* r) {
  const size_t fed = static_cast<size_t>(r->fed);
  size_t start_own = static_cast<size_t>(r->cached);
  // Keys/values all from the current weights, under an adapter still loaded (a retired adapter's
  // tree goes once nothing pins it; a request that pins nothing may outlive it).
  PrefixCache* pc = cache_of(r);
  const bool cacheable = !r->stale && stale_pins_ == 0 && pc && !pc->retired;
  if (fed > 0 && cacheable) {
    // Tokens [cached, already) were cached meanwhile by another request: ours are duplicates.
    size_t already = pc->tree->insert(r->tokens.data(), r->slots.data(), fed);
    for (size_t i = start_own; i < already; ++i) free_slots_.push_back(r->slots[i]);
    start_own = fed;  // [max(cached, already), fed) now belong to the cache
  }
  for (size_t i = cacheable ? std::max(start_own, fed) : start_own; i < r->slots.size(); ++i)
    free_slots_.push_back(r->slots[i]);
  if (r->node != 0) {
    tree(r).unlock(r->node);  // a pinned tree is never dropped
    // The last request pinning pre-reload prefixes is gone: nothing is locked now, drop them all.
    if (r->stale && --stale_pins_ == 0) flush_unpinned();
    else drop_if_idle(r->cache_id);
  }
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  active_.erase(std::remove(active_.begin(), active_.end(), r), active_.end());
  if (auto it = reqs_.find(r->rid); it != reqs_.end() && it->second.get() == r) reqs_.erase(it);
  aborted_.erase(std::remove_if(aborted_.begin(), aborted_.end(), [r](auto& p) { return p.get() == r; }), aborted_.end());
}

void Engine::share_prompt(Request* r) {
  // Hand the freshly prefilled prompt to the cache so requests added from now on reuse it, and
  // switch this request to the cache's slots wherever the cache already had the same tokens.
  PrefixCache* pc = cache_of(r);
  if (r->stale || stale_pins_ > 0 || !pc || pc->retired) return;
  RadixCache& t = *pc->tree;
  const size_t fed = static_cast<size_t>(r->fed);
  t.insert(r->tokens.data(), r->slots.data(), fed);
  RadixCache::Match m = t.match(r->tokens.data(), fed);
  // The budget is the whole pool, so everything fits; should a tail not have been kept, its
  // slots came back to the free list and are taken out again (this request still uses them).
  for (size_t i = m.length; i < fed; ++i) {
    auto it = std::find(free_slots_.begin(), free_slots_.end(), r->slots[i]);
    if (it != free_slots_.end()) free_slots_.erase(it);
  }
  if (m.length <= static_cast<size_t>(r->cached)) return;
  for (size_t i = static_cast<size_t>(r->cached); i < m.length; ++i)
    if (m.slots[i] != r->slots[i]) {
      free_slots_.push_back(r->slots[i]);  // a duplicate of what the cache holds
      r->slots[i] = m.slots[i];
    }
  t.lock(m.node);
  if (r->node != 0) t.unlock(r->node);
  r->node = m.node;
  r->cached = static_cast<int>(m.length);
}

bool Engine::finished(Request& r, EngineEvent& ev) const {
  const int t = r.tokens.back();
  if (is_stop_token(r.sp, model_.cfg.eos_token_id, t)) {
    ev.finish = EngineEvent::Stop;
    ev.finish_value = t;
  } else if ((r.sp.max_new_tokens >= 0 && r.n_gen >= std::max(1, r.sp.max_new_tokens)) ||
             r.prompt_len + r.n_gen >= model_.cfg.max_position_embeddings) {
    ev.finish = EngineEvent::Length;
    ev.finish_value = r.n_gen;
  }
  return ev.finish != EngineEvent::None;
}

std::vector<EngineEvent> Engine::step() {
  std::lock_guard<std::mutex> compute(compute_mu_);
  std::vector<EngineEvent> events;
  std::vector<Request*> batch;
  std::vector<SeqChunk> chunks;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++undelivered_;
    // Admit waiting requests in order while there are places, slots for their whole length, and
    // room in this step's prefill budget (the first is always taken, so long prompts still run).
    size_t prefill_rows = 0;
    while (!waiting_.empty() && static_cast<int>(active_.size()) < max_running_) {
      Request* r = waiting_.front();
      const size_t rows = static_cast<size_t>(r->prompt_len - r->fed);
      if (prefill_rows > 0 && prefill_rows + rows > kMaxPrefillRows) break;
      size_t need = static_cast<size_t>(r->max_fed) - r->slots.size();
      if (!ensure_free(need)) {
        if (!active_.empty()) break;  // wait for running requests to give slots back
        unpin_waiting();              // nothing runs: waiting requests' cache hits are in the way
        need = static_cast<size_t>(r->max_fed) - r->slots.size();
        if (!ensure_free(need)) {
          EngineEvent ev;
          ev.rid = r->rid;
          ev.serial = r->serial;
          ev.finish = EngineEvent::Abort;
          ev.message = "the KV cache cannot hold this request (" + std::to_string(need) + " tokens)";
          events.push_back(ev);
          release(r);
          continue;
        }
      }
      r->slots.insert(r->slots.end(), free_slots_.end() - static_cast<long>(need), free_slots_.end());
      free_slots_.resize(free_slots_.size() - need);
      r->admitted = true;
      prefill_rows += rows;
      waiting_.pop_front();
      active_.push_back(r);
    }
    for (Request* r : active_) {
      r->in_batch = true;
      batch.push_back(r);
      const int n_in = r->n_gen == 0 ? r->prompt_len - r->fed : 1;  // prefill rest, or the last token
      const bool lora = r->adapter && !r->adapter->model;
      chunks.push_back({r->tokens.data() + r->fed, n_in, r->fed, r->slots.data(), lora ? &r->adapter->view : nullptr});
    }
  }
  if (batch.empty()) return events;
  std::string error;
  try {
    forward_batch(batch, chunks);
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::lock_guard<std::mutex> lk(mu_);
  const int V = model_.cfg.vocab_size;
  // Sample every request's token (in parallel for large vocabularies: each has its own generator).
  const long nb = static_cast<long>(batch.size());
  std::vector<int> toks(batch.size(), -1);
  std::vector<float> lps(batch.size(), 0.0f);
  if (error.empty()) {
#pragma omp parallel for schedule(dynamic) if (nb > 1 && V >= 4096)
    for (long i = 0; i < nb; ++i) {
      Request* r = batch[i];
      if (r->aborted) continue;
      thread_local std::vector<float> scratch;
      toks[i] = sample_token(logits_.data() + i * static_cast<size_t>(V), V, r->sp, model_.cfg.eos_token_id, r->n_gen,
                             r->rng, &lps[i], scratch);
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    Request* r = batch[i];
    r->in_batch = false;
    r->fed += chunks[i].n;
    if (r->aborted) {
      release(r);
      continue;
    }
    EngineEvent ev;
    ev.rid = r->rid;
    ev.serial = r->serial;
    if (!error.empty()) {
      ev.finish = EngineEvent::Abort;
      ev.message = "forward failed: " + error;
      events.push_back(ev);
      release(r);
      continue;
    }
    ev.token = toks[i];
    ev.logprob = lps[i];
    r->tokens.push_back(ev.token);
    r->n_gen++;
    const bool done = finished(*r, ev);
    events.push_back(ev);
    if (done) release(r);
    else if (r->n_gen == 1) share_prompt(r);
  }
  return events;
}

const Model& Engine::model_of(const Request* r) const {
  return r->adapter && r->adapter->model ? *r->adapter->model : model_;
}

void Engine::forward_batch(const std::vector<Request*>& batch, const std::vector<SeqChunk>& chunks) {
  // One forward over the whole batch when every request runs on the base's weights (with or without
  // an adapter); with named whole models, one forward per model over the shared KV pool (each
  // request's slots are its own), its rows put back in batch order.
  const Model* first = &model_of(batch[0]);
  bool one = true;
  for (Request* r : batch) one = one && &model_of(r) == first;
  if (one) {
    forward_step(*first, rope_, kv_, chunks, false, ws_, logits_);
    return;
  }
  const size_t V = static_cast<size_t>(model_.cfg.vocab_size);
  logits_.resize(batch.size() * V);
  std::vector<bool> done(batch.size(), false);
  std::vector<SeqChunk> part;
  std::vector<size_t> rows;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (done[i]) continue;
    const Model* m = &model_of(batch[i]);
    part.clear(), rows.clear();
    for (size_t j = i; j < batch.size(); ++j)
      if (!done[j] && &model_of(batch[j]) == m) part.push_back(chunks[j]), rows.push_back(j), done[j] = true;
    forward_step(*m, rope_, kv_, part, false, ws_, part_logits_);
    for (size_t k = 0; k < rows.size(); ++k)
      std::copy(part_logits_.begin() + k * V, part_logits_.begin() + (k + 1) * V, logits_.begin() + rows[k] * V);
  }
}

void Engine::deliver(std::vector<EngineEvent>& events) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!aborted_serials_.empty())
    events.erase(std::remove_if(events.begin(), events.end(),
                                [this](const EngineEvent& e) { return aborted_serials_.count(e.serial) > 0; }),
                 events.end());
  if (undelivered_ > 0 && --undelivered_ == 0) aborted_serials_.clear();
}

void Engine::load_weights(Model&& model, bool keep_cache) {
  if (!same_architecture(model_.cfg, model.cfg)) throw std::invalid_argument("the new weights' config differs from the running model's");
  std::lock_guard<std::mutex> compute(compute_mu_);
  std::lock_guard<std::mutex> lk(mu_);
  model_.params.swap(model.params);
  if (keep_cache) return;
  // Cached keys/values are stale under new weights. Running requests keep theirs (and go on with
  // the new weights, as SGLang's in-place pause does) but nothing computed before this point is
  // cached or reused again: unpinned prefixes go now, pinned ones when their last request ends.
  unpin_waiting();
  for (Request* r : active_) {
    if (r->node != 0 && !r->stale) ++stale_pins_;
    r->stale = true;
  }
  flush_unpinned();
}

std::vector<float> Engine::forward_logits(const std::vector<int32_t>& tokens, const std::string& adapter) {
  std::shared_ptr<const EngineAdapter> a;
  {
    std::lock_guard<std::mutex> lk(mu_);
    a = find_adapter(adapter, "forwardLogits: ");
  }
  std::lock_guard<std::mutex> compute(compute_mu_);
  for (int32_t t : tokens)
    if (t < 0 || t >= model_.cfg.vocab_size) throw std::invalid_argument("token id outside the vocabulary");
  if (tokens.empty() || static_cast<int>(tokens.size()) > model_.cfg.max_position_embeddings)
    throw std::invalid_argument("forwardLogits: need 1..max_position_embeddings tokens");
  if (a && a->model) return forward_full(*a->model, tokens.data(), static_cast<int>(tokens.size()), nullptr);
  return forward_full(model_, tokens.data(), static_cast<int>(tokens.size()), a ? &a->view : nullptr);
}

}  // namespace ooze
