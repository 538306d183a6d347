// AdamW with decoupled weight decay and global-norm gradient clipping over a model's flat parameter
// buffer; optimizer state (first and second moments, step) lives natively beside the parameters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace ooze {

struct AdamWConfig {
  float lr = 1e-6f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  /** Decoupled (p −= lr·wd·p), applied to every ≥2-D tensor (embeddings and Linear weights), never to
   *  1-D tensors (the RMSNorm weights). */
  float weight_decay = 0.0f;
  /** Clip the global L2 norm of all gradients to this; 0 disables clipping. */
  float max_grad_norm = 1.0f;
};

/** Moments in the Model layout and the number of steps taken. */
struct AdamWState {
  std::vector<float> m, v;
  int64_t step = 0;
};

struct OptimResult {
  double grad_norm = 0;  // global L2 norm before clipping
  double clip_coef = 1;  // factor the gradients were scaled by
  bool skipped = false;  // the norm was not finite: no update, step not advanced
  int64_t step = 0;      // steps taken after this call
};

/** Empty string when usable, else what is wrong. */
std::string validate_adamw(const AdamWConfig& c);

/** Global L2 norm of n floats (double accumulation). */
double global_grad_norm(const float* g, size_t n);

/** One set of parameters an optimizer step updates: its tensor layout, values, grads and moments. */
struct ParamSet {
  const std::vector<TensorInfo>* tensors;  // layout; weight decay applies to tensors of rank >= 2
  size_t n;                                // floats in params and grads
  float* params;
  float* grads;
  AdamWState* st;
};

/**
 * Clips `grads` in place (coef = min(1, max_norm / (norm + 1e-6)), as torch's clip_grad_norm_), then
 * one AdamW step on `params` with bias-corrected moments. Allocates the state on first use.
 */
OptimResult adamw_step(const Model& m, float* params, float* grads, AdamWState& st, const AdamWConfig& c);

/**
 * adamw_step over several parameter sets at once (the policy and the critic's value head): one global
 * gradient norm over all of them, one clip coefficient, then each set's AdamW update. A non-finite
 * norm skips every set. The result's step is the first set's. With `zero_grads`, the update leaves
 * every gradient 0 instead of clipped (one pass over the grads fewer for a caller that zeroes them
 * next); a skipped step leaves them as they were.
 */
OptimResult adamw_step_sets(const std::vector<ParamSet>& sets, const AdamWConfig& c, bool zero_grads = false);

/**
 * Writes the state to `path` (magic "OOZEADAM", u32 format 1, u64 count, i64 step, then m and v as
 * little-endian f32), through a temporary file renamed into place. A state never used is written as
 * zeros of `num_params`.
 */
void save_adamw_state(const AdamWState& st, size_t num_params, const std::string& path);

/** Reads a file written by save_adamw_state; throws std::runtime_error naming the file when it is
 *  malformed or holds a different number of parameters than `num_params`. */
AdamWState load_adamw_state(const std::string& path, size_t num_params);

}  // namespace ooze
