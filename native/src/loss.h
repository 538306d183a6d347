// Policy-gradient losses of RL training computed per token over a packed batch: PPO clip (asymmetric),
// dual clip, KL penalty against a reference policy (k1/k2/k3), entropy bonus, truncated importance
// sampling, a cross-entropy against the uniform distribution, per-token or per-sample reduction;
// returns metrics and dL/dlogprobs, dL/dentropy, dL/duniform_ce.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ooze {

/** KL estimators of KL(π_θ ‖ π_ref) from δ = logπ_θ − logπ_ref at sampled tokens (Schulman's k1/k2/k3). */
enum class KlType { K1, K2, K3 };
/** How per-token losses become one number. */
enum class Reduction {
  Token,   // Σ_t mask·ℓ / Σ_t mask over the whole batch
  Sample,  // mean over samples (with ≥1 masked token) of each sample's masked mean
};

struct LossConfig {
  float eps_clip = 0.2f;       // ratio lower bound 1 − eps_clip
  float eps_clip_high = 0.2f;  // ratio upper bound 1 + eps_clip_high
  float eps_clip_c = 0.0f;     // dual clip constant c > 1 for A < 0; 0 disables
  float kl_coef = 0.0f;        // weight of the KL penalty (needs reference logprobs)
  KlType kl_type = KlType::K3;
  float entropy_coef = 0.0f;   // entropy bonus: loss −= entropy_coef · entropy
  float uniform_coef = 0.0f;   // loss += uniform_coef · CE(uniform, π) (needs the forward's uniform_ce); 0 = off
  float tis_cap = 0.0f;        // truncated importance sampling cap; 0 disables (needs rollout logprobs)
  Reduction reduction = Reduction::Token;
  double normalizer = 0.0;     // >0: divide by this instead of the batch's own count (micro-batching)
  float value_coef = 0.0f;     // weight of the critic's value loss (needs values, old_values, returns); 0 = off
  float value_clip = 0.2f;     // V is kept within old_value ± value_clip in the clipped term; <= 0 disables
};

/** Per-token inputs aligned with the packed tokens (T entries each); nullable ones may be null. */
struct LossInputs {
  int T = 0;
  const int32_t* cu_seqlens = nullptr;  // num_seqs + 1 entries
  int num_seqs = 0;
  const float* logprobs = nullptr;  // current policy, from train_forward
  const float* entropy = nullptr;   // current policy, from train_forward
  const float* uniform_ce = nullptr;  // current policy's −mean_v log π(v), from train_forward; nullable unless uniform_coef
  const uint8_t* loss_mask = nullptr;  // 1 = model token that is trained on
  const float* advantages = nullptr;
  const float* old_logprobs = nullptr;      // policy that the ratio is taken against
  const float* rollout_logprobs = nullptr;  // inference engine's logprobs (TIS); nullable
  const float* ref_logprobs = nullptr;      // reference policy (KL); nullable
  const float* values = nullptr;      // critic's current values (value head); nullable
  const float* old_values = nullptr;  // critic's values when the returns were computed; nullable
  const float* returns = nullptr;     // value targets (GAE returns); nullable
};

/**
 * Loss metrics. Means use the configured reduction's weights, so with a normalizer each micro-batch
 * reports its share and the shares add up to the whole batch's means.
 */
struct LossMetrics {
  double loss = 0, pg_loss = 0, kl = 0, entropy = 0, clipfrac = 0, dual_clipfrac = 0;
  double uniform_ce = 0;  // mean cross-entropy of the uniform distribution against π (uniform_coef > 0 only)
  double ratio_mean = 0, ratio_min = 0, ratio_max = 0, tis_mean = 0;
  double ppo_kl = 0;  // mean of old − new logprob: how far this step's policy moved from the old one
  double num_tokens = 0, num_samples = 0;  // masked tokens, samples with ≥1 masked token
  double value_loss = 0, value_clipfrac = 0, value_mean = 0;  // critic (value_coef > 0 only)
};

/** Empty string when the config is usable with the given inputs, else what is wrong. */
std::string validate_loss(const LossConfig& c, const LossInputs& in);

/**
 * Per token t with mask 1: r = exp(logp − old), A = advantages[t],
 *   pg = max(−A·r, −A·clip(r, 1−eps_clip, 1+eps_clip_high)); for A < 0 with dual clip: pg = min(pg, −A·c);
 *   pg *= min(exp(old − rollout), tis_cap) when TIS is on;
 *   ℓ = pg + kl_coef·k(logp − ref) − entropy_coef·entropy + uniform_coef·uniform_ce.
 * Writes dL/dlogprobs, dL/dentropy and (when not null) dL/duniform_ce (T entries, 0 where mask is 0)
 * and returns the metrics.
 */
LossMetrics policy_loss(const LossConfig& c, const LossInputs& in, float* dlogprobs, float* dentropy,
                        float* duniform = nullptr);

/**
 * The critic's clipped value loss, added to `M` (loss += value_coef·value_loss) with the same
 * reduction weights as the policy loss. Per token t with mask 1: Vc = old + clip(V − old, ±value_clip),
 *   ℓ_v = max((V − R)², (Vc − R)²) / 2   (unclipped (V − R)²/2 when value_clip <= 0).
 * Writes dL/dvalues (T entries, value_coef included, 0 where mask is 0).
 */
void value_loss(const LossConfig& c, const LossInputs& in, float* dvalues, LossMetrics& M);

/** Reduction weight of every token (the loss is Σ w·ℓ); counts masked tokens and samples into M. */
std::vector<double> reduction_weights(const LossConfig& c, const LossInputs& in, LossMetrics& M);

}  // namespace ooze
