// The inference engine (see engine.h): admission against the KV slot pool and the radix prefix cache,
// batched prefill + decode through forward_step, sampling, and hand-back of finished sequences.
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
  // Every slot is free, held by a request, or held by the cache, so a budget of the whole pool
  // means insert() never has to drop tokens it was given.
  cache_ = std::make_unique<RadixCache>(static_cast<size_t>(pool), [this](const int32_t* s, size_t n) {
    free_slots_.insert(free_slots_.end(), s, s + n);
  });
}

int Engine::add(const std::string& rid, std::vector<int32_t> prompt, const SamplingParams& sp) {
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
  auto r = std::make_unique<Request>();
  r->rid = rid;
  r->serial = next_serial_++;
  r->prompt_len = n;
  r->tokens = std::move(prompt);
  r->sp = sp;
  r->rng = Rng(sp.seed);
  const int max_new = sp.max_new_tokens < 0 ? c.max_position_embeddings : std::max(1, sp.max_new_tokens);
  r->max_fed = std::min(n + max_new - 1, c.max_position_embeddings);
  // Leave the last prompt token uncached: its logits give the first sampled token. No reuse while
  // prefixes from before a weight reload are still pinned.
  RadixCache::Match m{0, {}, 0};
  if (stale_pins_ == 0) m = cache_->match(r->tokens.data(), static_cast<size_t>(n - 1));
  if (m.length > 0) {
    cache_->lock(m.node);
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
  return cache_->flush();
}

EngineCacheStats Engine::cache_stats() {
  std::lock_guard<std::mutex> lk(mu_);
  return {cache_->size(), cache_->budget(), prompt_tokens_, hit_tokens_, free_slots_.size()};
}

bool Engine::ensure_free(size_t n) {
  if (free_slots_.size() < n) cache_->evict(n - free_slots_.size());
  return free_slots_.size() >= n;
}

void Engine::unpin_waiting() {
  for (Request* r : waiting_) {
    if (r->cached == 0) continue;
    cache_->unlock(r->node);
    r->node = 0;
    r->cached = 0;
    r->fed = 0;
    r->slots.clear();
  }
}

void Engine::release(Request* r) {
  const size_t fed = static_cast<size_t>(r->fed);
  size_t start_own = static_cast<size_t>(r->cached);
  const bool cacheable = !r->stale && stale_pins_ == 0;  // keys/values all from the current weights
  if (fed > 0 && cacheable) {
    // Tokens [cached, already) were cached meanwhile by another request: ours are duplicates.
    size_t already = cache_->insert(r->tokens.data(), r->slots.data(), fed);
    for (size_t i = start_own; i < already; ++i) free_slots_.push_back(r->slots[i]);
    start_own = fed;  // [max(cached, already), fed) now belong to the cache
  }
  for (size_t i = cacheable ? std::max(start_own, fed) : start_own; i < r->slots.size(); ++i)
    free_slots_.push_back(r->slots[i]);
  if (r->node != 0) {
    cache_->unlock(r->node);
    // The last request pinning pre-reload prefixes is gone: nothing is locked now, drop them all.
    if (r->stale && --stale_pins_ == 0) cache_->flush();
  }
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  active_.erase(std::remove(active_.begin(), active_.end(), r), active_.end());
  if (auto it = reqs_.find(r->rid); it != reqs_.end() && it->second.get() == r) reqs_.erase(it);
  aborted_.erase(std::remove_if(aborted_.begin(), aborted_.end(), [r](auto& p) { return p.get() == r; }), aborted_.end());
}

void Engine::share_prompt(Request* r) {
  // Hand the freshly prefilled prompt to the cache so requests added from now on reuse it, and
  // switch this request to the cache's slots wherever the cache already had the same tokens.
  if (r->stale || stale_pins_ > 0) return;
  const size_t fed = static_cast<size_t>(r->fed);
  cache_->insert(r->tokens.data(), r->slots.data(), fed);
  RadixCache::Match m = cache_->match(r->tokens.data(), fed);
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
  cache_->lock(m.node);
  if (r->node != 0) cache_->unlock(r->node);
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
      chunks.push_back({r->tokens.data() + r->fed, n_in, r->fed, r->slots.data()});
    }
  }
  if (batch.empty()) return events;
  std::string error;
  try {
    forward_step(model_, rope_, kv_, chunks, false, ws_, logits_);
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

void Engine::deliver(std::vector<EngineEvent>& events) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!aborted_serials_.empty())
    events.erase(std::remove_if(events.begin(), events.end(),
                                [this](const EngineEvent& e) { return aborted_serials_.count(e.serial) > 0; }),
                 events.end());
  if (undelivered_ > 0 && --undelivered_ == 0) aborted_serials_.clear();
}

void Engine::load_weights(Model&& model) {
  const LlamaConfig &a = model_.cfg, &b = model.cfg;
  if (a.vocab_size != b.vocab_size || a.hidden_size != b.hidden_size || a.intermediate_size != b.intermediate_size ||
      a.num_hidden_layers != b.num_hidden_layers || a.num_attention_heads != b.num_attention_heads ||
      a.num_key_value_heads != b.num_key_value_heads || a.tie_word_embeddings != b.tie_word_embeddings ||
      a.max_position_embeddings != b.max_position_embeddings || a.rope_theta != b.rope_theta ||
      !(a.rope_scaling == b.rope_scaling) || a.family != b.family || a.head_dim() != b.head_dim() ||
      a.qkv_bias != b.qkv_bias || a.o_bias != b.o_bias || a.qk_norm != b.qk_norm || a.sliding_window != b.sliding_window ||
      a.rms_norm_eps != b.rms_norm_eps || a.eos_token_id != b.eos_token_id)
    throw std::invalid_argument("the new weights' config differs from the running model's");
  std::lock_guard<std::mutex> compute(compute_mu_);
  std::lock_guard<std::mutex> lk(mu_);
  model_.params.swap(model.params);
  // Cached keys/values are stale under new weights. Running requests keep theirs (and go on with
  // the new weights, as SGLang's in-place pause does) but nothing computed before this point is
  // cached or reused again: unpinned prefixes go now, pinned ones when their last request ends.
  unpin_waiting();
  for (Request* r : active_) {
    if (r->node != 0 && !r->stale) ++stale_pins_;
    r->stale = true;
  }
  if (!cache_->flush()) cache_->evict(cache_->size());
}

std::vector<float> Engine::forward_logits(const std::vector<int32_t>& tokens) {
  std::lock_guard<std::mutex> compute(compute_mu_);
  for (int32_t t : tokens)
    if (t < 0 || t >= model_.cfg.vocab_size) throw std::invalid_argument("token id outside the vocabulary");
  if (tokens.empty() || static_cast<int>(tokens.size()) > model_.cfg.max_position_embeddings)
    throw std::invalid_argument("forwardLogits: need 1..max_position_embeddings tokens");
  return forward_full(model_, tokens.data(), static_cast<int>(tokens.size()));
}

}  // namespace ooze
