// Policy-gradient losses over a packed batch (see loss.h). Double accumulation; one pass per token.
#include "loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace ooze {

std::string validate_loss(const LossConfig& c, const LossInputs& in) {
  if (!(c.eps_clip >= 0) || !(c.eps_clip_high >= 0)) return "eps_clip and eps_clip_high must be >= 0";
  if (c.eps_clip_c != 0 && !(c.eps_clip_c > 1)) return "eps_clip_c (dual clip) must be > 1, or 0 to disable it";
  if (c.kl_coef != 0 && in.T > 0 && in.ref_logprobs == nullptr) return "kl_coef is set but no reference logprobs were given";
  if (!(c.tis_cap >= 0)) return "tis_cap must be >= 0 (0 disables TIS)";
  if (c.tis_cap > 0 && in.T > 0 && in.rollout_logprobs == nullptr) return "tis_cap is set but no rollout logprobs were given";
  if (!(c.normalizer >= 0)) return "normalizer must be >= 0 (0 = count the batch)";
  if (in.T > 0 && (!in.logprobs || !in.entropy || !in.loss_mask || !in.advantages || !in.old_logprobs))
    return "logprobs, entropy, loss_mask, advantages and old_logprobs are required";
  if (!in.cu_seqlens) return "cu_seqlens is required";
  if (!(c.uniform_coef >= 0)) return "uniform_coef must be >= 0 (0 = off)";
  if (c.uniform_coef > 0 && in.T > 0 && !in.uniform_ce) return "uniform_coef is set but the forward's uniform cross-entropy was not given";
  if (!(c.value_coef >= 0)) return "value_coef must be >= 0 (0 = no critic loss)";
  if (c.value_coef > 0 && in.T > 0 && (!in.values || !in.old_values || !in.returns))
    return "value_coef is set but values, old values or returns are missing (the trainer needs a value head and the batch oldValues and returns)";
  return "";
}

std::vector<double> reduction_weights(const LossConfig& c, const LossInputs& in, LossMetrics& M) {
  std::vector<double> w(in.T, 0.0);
  for (int s = 0; s < in.num_seqs; ++s) {
    int n = 0;
    for (int t = in.cu_seqlens[s]; t < in.cu_seqlens[s + 1]; ++t) n += in.loss_mask[t] != 0;
    M.num_tokens += n;
    if (n > 0) M.num_samples += 1;
    if (c.reduction == Reduction::Sample && n > 0)
      for (int t = in.cu_seqlens[s]; t < in.cu_seqlens[s + 1]; ++t) w[t] = in.loss_mask[t] ? 1.0 / n : 0.0;
  }
  double denom = c.normalizer > 0 ? c.normalizer : (c.reduction == Reduction::Token ? M.num_tokens : M.num_samples);
  if (denom <= 0) denom = 1;  // nothing masked: loss 0, no gradient
  for (int t = 0; t < in.T; ++t)
    w[t] = c.reduction == Reduction::Token ? (in.loss_mask[t] ? 1.0 / denom : 0.0) : w[t] / denom;
  return w;
}

LossMetrics policy_loss(const LossConfig& c, const LossInputs& in, float* dlogprobs, float* dentropy, float* duniform) {
  LossMetrics M;
  std::fill(dlogprobs, dlogprobs + in.T, 0.0f);
  std::fill(dentropy, dentropy + in.T, 0.0f);
  if (duniform) std::fill(duniform, duniform + in.T, 0.0f);
  const bool uniform = c.uniform_coef > 0;
  const std::vector<double> w = reduction_weights(c, in, M);

  const bool tis = c.tis_cap > 0, kl = in.ref_logprobs != nullptr, dual = c.eps_clip_c > 0;
  M.ratio_min = std::numeric_limits<double>::infinity();
  M.ratio_max = -std::numeric_limits<double>::infinity();
  for (int t = 0; t < in.T; ++t) {
    if (!in.loss_mask[t]) continue;
    const double lp = in.logprobs[t], A = in.advantages[t];
    const double ratio = std::exp(lp - in.old_logprobs[t]);
    const double clipped_ratio = std::clamp(ratio, 1.0 - c.eps_clip, 1.0 + c.eps_clip_high);
    const double pg1 = -A * ratio, pg2 = -A * clipped_ratio;
    double pg = std::max(pg1, pg2);
    double dpg = pg1 >= pg2 ? -A * ratio : 0.0;  // d pg / d logp
    const bool clipped = pg2 > pg1;
    bool dual_clipped = false;
    if (dual && A < 0) {
      const double pg3 = -A * c.eps_clip_c;
      if (pg3 < pg) pg = pg3, dpg = 0.0, dual_clipped = true;
    }
    double tw = 1.0;
    if (tis) tw = std::min(std::exp(static_cast<double>(in.old_logprobs[t]) - in.rollout_logprobs[t]), static_cast<double>(c.tis_cap));
    pg *= tw, dpg *= tw;
    double k = 0, dk = 0;
    if (kl) {
      const double delta = lp - in.ref_logprobs[t];
      switch (c.kl_type) {
        case KlType::K1: k = delta, dk = 1.0; break;
        case KlType::K2: k = 0.5 * delta * delta, dk = delta; break;
        case KlType::K3: k = std::exp(-delta) - 1.0 + delta, dk = 1.0 - std::exp(-delta); break;
      }
    }
    const double ent = in.entropy[t];
    const double uce = uniform ? in.uniform_ce[t] : 0.0;
    const double l = pg + c.kl_coef * k - c.entropy_coef * ent + c.uniform_coef * uce;
    const double wt = w[t];
    M.loss += wt * l;
    M.pg_loss += wt * pg;
    M.kl += wt * k;
    M.entropy += wt * ent;
    M.uniform_ce += wt * uce;
    M.clipfrac += wt * (clipped ? 1.0 : 0.0);
    M.dual_clipfrac += wt * (dual_clipped ? 1.0 : 0.0);
    M.ratio_mean += wt * ratio;
    M.ppo_kl += wt * (in.old_logprobs[t] - lp);
    M.tis_mean += wt * tw;
    M.ratio_min = std::min(M.ratio_min, ratio);
    M.ratio_max = std::max(M.ratio_max, ratio);
    dlogprobs[t] = static_cast<float>(wt * (dpg + c.kl_coef * dk));
    dentropy[t] = static_cast<float>(-wt * c.entropy_coef);
    if (duniform) duniform[t] = static_cast<float>(wt * c.uniform_coef);
  }
  if (M.num_tokens == 0) M.ratio_min = M.ratio_max = 0;
  return M;
}

void value_loss(const LossConfig& c, const LossInputs& in, float* dvalues, LossMetrics& M) {
  std::fill(dvalues, dvalues + in.T, 0.0f);
  LossMetrics counts;
  const std::vector<double> w = reduction_weights(c, in, counts);
  const bool clip = c.value_clip > 0;
  for (int t = 0; t < in.T; ++t) {
    if (!in.loss_mask[t]) continue;
    const double v = in.values[t], old = in.old_values[t], R = in.returns[t];
    const double l1 = 0.5 * (v - R) * (v - R);
    double l = l1, dv = v - R;
    bool clipped = false;
    if (clip) {
      const double vc = old + std::clamp(v - old, -static_cast<double>(c.value_clip), static_cast<double>(c.value_clip));
      const double l2 = 0.5 * (vc - R) * (vc - R);
      if (l2 > l1) l = l2, dv = 0.0, clipped = true;  // V is outside the clip range: Vc does not move with V
    }
    M.value_loss += w[t] * l;
    M.value_clipfrac += w[t] * (clipped ? 1.0 : 0.0);
    M.value_mean += w[t] * v;
    dvalues[t] = static_cast<float>(w[t] * c.value_coef * dv);
  }
  M.loss += c.value_coef * M.value_loss;
}

}  // namespace ooze
