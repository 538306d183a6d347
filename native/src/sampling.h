// Token sampling for the inference engine: temperature, top-k, top-p, min_new_tokens, stop ids, and
// a per-request seeded RNG, so the same seed and inputs give the same tokens in any batch.
#pragma once
#include <cstdint>
#include <vector>

namespace ooze {

/** Sampling settings of one request (SGLang semantics; defaults applied by the caller). */
struct SamplingParams {
  int max_new_tokens = -1;      // -1 = until the context is full
  float temperature = 1.0f;     // < 1e-6 = greedy
  float top_p = 1.0f;           // (0, 1]
  int top_k = -1;               // -1 = all
  int min_new_tokens = 0;       // EOS and stop ids are masked until this many tokens exist
  std::vector<int> stop_token_ids;
  bool ignore_eos = false;
  uint64_t seed = 0;
};

/** splitmix64-seeded xoshiro256** — small, fast, identical on every platform. */
class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next();
  /** Uniform in [0, 1) with 53 random bits. */
  double uniform();

 private:
  uint64_t s_[4];
};

/** Whether `token` ends generation for these settings (stop ids, and EOS unless ignore_eos). */
bool is_stop_token(const SamplingParams& sp, int eos_id, int token);

/**
 * Samples one token from `logits[0..vocab)` for a request that has produced `n_generated` tokens
 * so far. Masks EOS/stop ids while n_generated < min_new_tokens. Sets *logprob to the log-softmax of
 * the unmasked logits / temperature at the chosen token (temperature 1 when greedy). `scratch` is
 * reused between calls. Draws exactly one number from `rng` when not greedy. Top-k then top-p
 * (renormalised over the top-k); the nucleus is found in O(vocab) expected time, without a full sort.
 */
int sample_token(const float* logits, int vocab, const SamplingParams& sp, int eos_id, int n_generated, Rng& rng,
                 float* logprob, std::vector<float>& scratch);

}  // namespace ooze
