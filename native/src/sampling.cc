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

namespace {

struct Cand {
  float s;   // scaled logit
  int id;    // token id
  double p;  // exp(s - max over the vocabulary), unnormalised
};

/** Strict total order: higher logit first, lower id first among equal logits. */
bool before(const Cand& a, const Cand& b) { return a.s > b.s || (a.s == b.s && a.id < b.id); }

/**
 * Size of the nucleus: the shortest prefix of `c` in `before` order whose mass reaches `target`.
 * Reorders `c` so that prefix comes first, in O(n) expected time (a weighted quickselect that
 * sorts only the small range around the crossing); `sorted` says `c` is already in order.
 */
size_t nucleus(std::vector<Cand>& c, double target, bool sorted) {
  size_t lo = 0, hi = c.size();
  double acc = 0;  // mass of c[0..lo), all before every element of c[lo..hi)
  while (!sorted && hi - lo > 32) {
    const size_t mid = lo + (hi - lo) / 2;
    // Median of three as the pivot, moved to hi-1.
    if (before(c[mid], c[lo])) std::swap(c[mid], c[lo]);
    if (before(c[hi - 1], c[lo])) std::swap(c[hi - 1], c[lo]);
    if (before(c[mid], c[hi - 1])) std::swap(c[mid], c[hi - 1]);
    const Cand pivot = c[hi - 1];
    auto split = std::partition(c.begin() + static_cast<long>(lo), c.begin() + static_cast<long>(hi - 1),
                                [&](const Cand& x) { return before(x, pivot); });
    const size_t m = static_cast<size_t>(split - c.begin());
    double upper = 0;
    for (size_t j = lo; j < m; ++j) upper += c[j].p;
    if (acc + upper >= target) {
      hi = m;  // the crossing is among the elements before the pivot
      continue;
    }
    acc += upper;
    std::swap(c[m], c[hi - 1]);  // the pivot comes right after them
    if (acc + c[m].p >= target) return m + 1;
    acc += c[m].p;
    lo = m + 1;
  }
  if (!sorted) std::sort(c.begin() + static_cast<long>(lo), c.begin() + static_cast<long>(hi), before);
  for (size_t j = lo; j < hi; ++j) {
    acc += c[j].p;
    if (acc >= target) return j + 1;
  }
  return hi;
}

}  // namespace

int sample_token(const float* logits, int vocab, const SamplingParams& sp, int eos_id, int n_generated, Rng& rng,
                 float* logprob, std::vector<float>& scratch) {
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
  // w_i = exp(s_i - max) once, in fp32 (the slow part for large vocabularies); z summed in fp64.
  thread_local std::vector<float> w;
  w.resize(vocab);
  double z = 0;
  for (int i = 0; i < vocab; ++i) z += (w[i] = std::exp(scratch[i] - mx));
  const double log_z = mx + std::log(z);
  // EOS and stop ids are masked until min_new_tokens are out.
  const bool masking = n_generated < sp.min_new_tokens;
  int chosen = -1;
  if (greedy) {
    float best = neg_inf;
    for (int i = 0; i < vocab; ++i)
      if (!(masking && is_stop_token(sp, eos_id, i)) && (chosen < 0 || scratch[i] > best)) best = scratch[i], chosen = i;
  } else if (!masking && sp.top_k <= 0 && !(sp.top_p < 1.0f)) {
    // The whole vocabulary, unfiltered (RL rollouts): draw from w directly. Same sum, same order and
    // the same draw as the candidate path below, without building the candidate list.
    const double u = rng.uniform() * z;
    double acc = 0;
    chosen = vocab - 1;
    for (int i = 0; i < vocab; ++i) {
      acc += w[i];
      if (u < acc) {
        chosen = i;
        break;
      }
    }
  } else {
    thread_local std::vector<Cand> c;
    c.clear();
    for (int i = 0; i < vocab; ++i)
      if (!(masking && is_stop_token(sp, eos_id, i))) c.push_back({scratch[i], i, w[i]});
    bool sorted = false;
    if (sp.top_k > 0 && static_cast<size_t>(sp.top_k) < c.size()) {
      std::partial_sort(c.begin(), c.begin() + sp.top_k, c.end(), before);
      c.resize(static_cast<size_t>(sp.top_k));
      sorted = true;
    }
    if (!c.empty()) {
      double sum = 0;
      for (auto& x : c) sum += x.p;
      if (!(sum > 0)) {  // all candidates far below a masked maximum: weigh them against their own
        float mk = neg_inf;
        for (auto& x : c) mk = std::max(mk, x.s);
        sum = 0;
        for (auto& x : c) sum += (x.p = std::exp(static_cast<double>(x.s - mk)));
      }
      const size_t keep = sp.top_p < 1.0f ? nucleus(c, sum * sp.top_p, sorted) : c.size();
      double total = 0;
      for (size_t j = 0; j < keep; ++j) total += c[j].p;
      const double u = rng.uniform() * total;
      double acc = 0;
      chosen = c[keep - 1].id;
      for (size_t j = 0; j < keep; ++j) {
        acc += c[j].p;
        if (u < acc) {
          chosen = c[j].id;
          break;
        }
      }
    }
  }
  if (chosen < 0) chosen = 0;  // every token masked: cannot happen with vocab > stop ids
  *logprob = static_cast<float>(scratch[chosen] - log_z);
  return chosen;
}

}  // namespace ooze
