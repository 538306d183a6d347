// AdamW and global-norm gradient clipping (see optim.h).
#include "optim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace ooze {

std::string validate_adamw(const AdamWConfig& c) {
  if (!(c.lr >= 0) || !std::isfinite(c.lr)) return "lr must be a finite number >= 0";
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return "beta1 must be in [0, 1)";
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return "beta2 must be in [0, 1)";
  if (!(c.eps > 0)) return "eps must be > 0";
  if (!(c.weight_decay >= 0)) return "weight_decay must be >= 0";
  if (!(c.max_grad_norm >= 0)) return "max_grad_norm must be >= 0 (0 disables clipping)";
  return "";
}

double global_grad_norm(const float* g, size_t n) {
  double s = 0;
  // Vector lanes of partial sums (fp64 reordered), so the sum is bound by memory, not by add latency.
#pragma omp parallel for simd reduction(+ : s) schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
  return std::sqrt(s);
}

OptimResult adamw_step(const Model& m, float* params, float* grads, AdamWState& st, const AdamWConfig& c) {
  return adamw_step_sets({ParamSet{&m.tensors, m.params.size(), params, grads, &st}}, c);
}

OptimResult adamw_step_sets(const std::vector<ParamSet>& sets, const AdamWConfig& c, bool zero_grads) {
  OptimResult r;
  double sq = 0;
  for (const ParamSet& s : sets) {
    const double n = global_grad_norm(s.grads, s.n);
    sq += n * n;
  }
  r.grad_norm = std::sqrt(sq);
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    r.step = sets.empty() ? 0 : sets[0].st->step;
    return r;
  }
  if (c.max_grad_norm > 0) r.clip_coef = std::min(1.0, c.max_grad_norm / (r.grad_norm + 1e-6));
  // Clip, moments, update and (zero_grads) clearing in one pass over the buffers: the step is bound
  // by memory traffic. The clipped gradient is g·f in fp32, as an in-place clip would leave it.
  const bool clip = r.clip_coef < 1.0;
  const float f = static_cast<float>(r.clip_coef);
  const float b1 = c.beta1, b2 = c.beta2, eps = c.eps;
  for (size_t k = 0; k < sets.size(); ++k) {
    const ParamSet& s = sets[k];
    AdamWState& st = *s.st;
    const size_t n = s.n;
    if (st.m.size() != n) st.m.assign(n, 0.0f), st.v.assign(n, 0.0f);
    st.step += 1;
    const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(st.step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(st.step));
    const float step_size = static_cast<float>(c.lr / bc1);
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    for (const TensorInfo& t : *s.tensors) {
      const float decay = t.shape.size() >= 2 ? 1.0f - c.lr * c.weight_decay : 1.0f;
      float* __restrict p = s.params + t.offset;
      float* __restrict g = s.grads + t.offset;
      float* __restrict mm = st.m.data() + t.offset;
      float* __restrict vv = st.v.data() + t.offset;
      const long cnt = static_cast<long>(t.numel());
#pragma omp parallel for schedule(static) if (cnt > 65536)
      for (long i = 0; i < cnt; ++i) {
        const float gi = clip ? g[i] * f : g[i];
        if (zero_grads) g[i] = 0.0f;
        else if (clip) g[i] = gi;
        mm[i] = b1 * mm[i] + (1.0f - b1) * gi;
        vv[i] = b2 * vv[i] + (1.0f - b2) * gi * gi;
        const float denom = std::sqrt(vv[i]) * inv_sqrt_bc2 + eps;
        p[i] = p[i] * decay - step_size * mm[i] / denom;
      }
    }
    if (k == 0) r.step = st.step;
  }
  return r;
}

namespace {
constexpr char kMagic[8] = {'O', 'O', 'Z', 'E', 'A', 'D', 'A', 'M'};
constexpr uint32_t kFormat = 1;
}  // namespace

void save_adamw_state(const AdamWState& st, size_t num_params, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error("cannot write optimizer state to " + tmp);
    const uint64_t n = num_params;
    const int64_t step = st.step;
    f.write(kMagic, sizeof kMagic);
    f.write(reinterpret_cast<const char*>(&kFormat), sizeof kFormat);
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(reinterpret_cast<const char*>(&step), sizeof step);
    if (st.m.size() == num_params) {
      f.write(reinterpret_cast<const char*>(st.m.data()), static_cast<std::streamsize>(n * sizeof(float)));
      f.write(reinterpret_cast<const char*>(st.v.data()), static_cast<std::streamsize>(n * sizeof(float)));
    } else {
      std::vector<float> zeros(num_params, 0.0f);
      for (int i = 0; i < 2; ++i)
        f.write(reinterpret_cast<const char*>(zeros.data()), static_cast<std::streamsize>(n * sizeof(float)));
    }
    f.flush();
    if (!f) throw std::runtime_error("writing optimizer state to " + tmp + " failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

AdamWState load_adamw_state(const std::string& path, size_t num_params) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open optimizer state " + path);
  char magic[8];
  uint32_t format = 0;
  uint64_t n = 0;
  int64_t step = 0;
  f.read(magic, sizeof magic);
  f.read(reinterpret_cast<char*>(&format), sizeof format);
  f.read(reinterpret_cast<char*>(&n), sizeof n);
  f.read(reinterpret_cast<char*>(&step), sizeof step);
  if (!f || std::memcmp(magic, kMagic, sizeof magic) != 0 || format != kFormat)
    throw std::runtime_error(path + ": not an ooze optimizer state file (bad header)");
  if (n != num_params)
    throw std::runtime_error(path + ": holds state for " + std::to_string(n) + " parameters, the model has " +
                             std::to_string(num_params));
  if (step < 0) throw std::runtime_error(path + ": negative step count");
  AdamWState st;
  st.step = step;
  st.m.resize(n), st.v.resize(n);
  f.read(reinterpret_cast<char*>(st.m.data()), static_cast<std::streamsize>(n * sizeof(float)));
  f.read(reinterpret_cast<char*>(st.v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  if (!f) throw std::runtime_error(path + ": truncated (expected " + std::to_string(n) + " floats of m and of v)");
  return st;
}

}  // namespace ooze
