// Token sampling (see sampling.h): greedy or temperature sampling restricted to top-k then top-p,
// with a per-request xoshiro256** generator.
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ooze {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

bool is_stop_token(const SamplingParams& sp, int eos_id, int token) {
  if (!sp.ignore_eos && token == eos_id) return true;
  return std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), token) != sp.stop_token_ids.end();
}

int sample_token(const float* logits, int vocab, const SamplingParams& sp, int eos_id, int n_generated, Rng& rng,
                 float* logprob, std::vector<float>& scratch, std::vector<int>& order) {
  const bool greedy = sp.temperature < 1e-6f;
  const float inv_t = greedy ? 1.0f : 1.0f / sp.temperature;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Scaled logits and their log-normaliser (over the whole vocabulary, unmasked).
  scratch.resize(vocab);
  float mx = neg_inf;
  for (int i = 0; i < vocab; ++i) {
    scratch[i] = logits[i] * inv_t;
    mx = std::max(mx, scratch[i]);
  }
  double z = 0;
  for (int i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(scratch[i] - mx));
  const double log_z = mx + std::log(z);
  // Mask EOS and stop ids until min_new_tokens are out.
  auto masked = [&](int i) {
    return n_generated < sp.min_new_tokens && is_stop_token(sp, eos_id, i);
  };
  int chosen = -1;
  if (greedy) {
    float best = neg_inf;
    for (int i = 0; i < vocab; ++i)
      if (!masked(i) && (chosen < 0 || scratch[i] > best)) best = scratch[i], chosen = i;
  } else {
    order.clear();
    for (int i = 0; i < vocab; ++i)
      if (!masked(i)) order.push_back(i);
    auto by_logit = [&](int a, int b) { return scratch[a] > scratch[b] || (scratch[a] == scratch[b] && a < b); };
    size_t k = order.size();
    if (sp.top_k > 0 && static_cast<size_t>(sp.top_k) < k) {
      k = static_cast<size_t>(sp.top_k);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), by_logit);
      order.resize(k);
    } else if (sp.top_p < 1.0f && !order.empty()) {
      // Sort only as much of the head as the nucleus needs (a full sort of a 32k vocabulary per
      // token is the slow part otherwise): grow the sorted prefix until it holds top_p of the mass.
      double m0 = neg_inf, all = 0;
      for (int i : order) m0 = std::max(m0, static_cast<double>(scratch[i]));
      for (int i : order) all += std::exp(scratch[i] - m0);
      size_t k = std::min<size_t>(64, order.size());
      while (true) {
        std::partial_sort(order.begin(), order.begin() + static_cast<long>(k), order.end(), by_logit);
        double head = 0;
        for (size_t j = 0; j < k; ++j) head += std::exp(scratch[order[j]] - m0);
        if (k == order.size() || head / all >= sp.top_p + 1e-9) break;
        k = std::min(order.size(), k * 8);
      }
    }
    // Probabilities of the candidates, renormalised; then the smallest prefix reaching top_p.
    double mk = neg_inf;
    for (int i : order) mk = std::max(mk, static_cast<double>(scratch[i]));
    thread_local std::vector<double> p;
    p.resize(order.size());
    double sum = 0;
    for (size_t j = 0; j < order.size(); ++j) sum += (p[j] = std::exp(scratch[order[j]] - mk));
    size_t keep = order.size();
    if (sp.top_p < 1.0f) {
      double acc = 0;
      for (size_t j = 0; j < order.size(); ++j) {
        acc += p[j] / sum;
        if (acc >= sp.top_p) {
          keep = j + 1;
          break;
        }
      }
    }
    double total = 0;
    for (size_t j = 0; j < keep; ++j) total += p[j];
    double u = rng.uniform() * total, acc = 0;
    chosen = order[keep - 1];
    for (size_t j = 0; j < keep; ++j) {
      acc += p[j];
      if (u < acc) {
        chosen = order[j];
        break;
      }
    }
  }
  if (chosen < 0) chosen = 0;  // every token masked: cannot happen with vocab > stop ids
  *logprob = static_cast<float>(scratch[chosen] - log_z);
  return chosen;
}

}  // namespace ooze
