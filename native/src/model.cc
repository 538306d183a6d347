// Config checks, rotary frequencies, tensor layout and random initialisation of the model (see model.h).
#include "model.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace ooze {

std::string LlamaConfig::validate() const {
  if (vocab_size <= 0) return "vocab_size must be > 0";
  if (hidden_size <= 0) return "hidden_size must be > 0";
  if (intermediate_size <= 0) return "intermediate_size must be > 0";
  if (num_hidden_layers <= 0) return "num_hidden_layers must be > 0";
  if (num_attention_heads <= 0) return "num_attention_heads must be > 0";
  if (num_key_value_heads <= 0) return "num_key_value_heads must be > 0";
  if (head_dim_explicit < 0) return "head_dim must be > 0";
  if (head_dim_explicit == 0 && hidden_size % num_attention_heads != 0)
    return "hidden_size must be divisible by num_attention_heads (or head_dim given)";
  if (sliding_window < 0) return "sliding_window must be > 0 or null";
  if (num_attention_heads % num_key_value_heads != 0)
    return "num_attention_heads must be divisible by num_key_value_heads";
  if (head_dim() % 2 != 0) return "head_dim must be even (rotary embeddings)";
  if (max_position_embeddings <= 0) return "max_position_embeddings must be > 0";
  if (rope_scaling.type != RopeType::Default && !(rope_scaling.factor > 0.0f)) return "rope_scaling.factor must be > 0";
  if (rope_scaling.type == RopeType::Llama3) {
    if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) || !(rope_scaling.low_freq_factor > 0.0f))
      return "rope_scaling: llama3 needs 0 < low_freq_factor < high_freq_factor";
  }
  if ((rope_scaling.type == RopeType::Llama3 || rope_scaling.type == RopeType::Yarn) &&
      rope_scaling.original_max_position_embeddings <= 0)
    return "rope_scaling.original_max_position_embeddings must be > 0";
  return "";
}

std::vector<float> rope_inv_freq(const LlamaConfig& cfg) {
  constexpr float kTwoPi = static_cast<float>(2.0 * 3.14159265358979323846);
  const int d = cfg.head_dim(), half = d / 2;
  const RopeScaling& r = cfg.rope_scaling;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(d);
    float f = 1.0f / std::pow(cfg.rope_theta, expo);
    if (r.type == RopeType::Linear) {
      f = f / r.factor;
    } else if (r.type == RopeType::Llama3) {
      // Wavelengths longer than the original context / low_freq_factor are slowed by `factor`, those
      // shorter than it / high_freq_factor kept, and the ones between blended (fp32, as transformers).
      const float old_len = static_cast<float>(r.original_max_position_embeddings);
      const float low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
      const float wavelen = kTwoPi / f;
      if (wavelen > low_wavelen) {
        f = f / r.factor;
      } else if (!(wavelen < high_wavelen)) {
        const float smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1.0f - smooth) * f / r.factor + smooth * f;
      }
    }
    inv[static_cast<size_t>(i)] = f;
  }
  if (r.type == RopeType::Yarn) {
    // Dimensions that rotate fewer than beta_slow times over the original context are interpolated
    // (divided by factor), more than beta_fast times kept, and those between ramped linearly. The
    // bounds in double, the blend in fp32, as transformers computes them.
    auto correction_dim = [&](double rotations) {
      return d * std::log(r.original_max_position_embeddings / (rotations * 2.0 * 3.14159265358979323846)) /
             (2.0 * std::log(static_cast<double>(cfg.rope_theta)));
    };
    double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
    if (r.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, static_cast<double>(d - 1));
    if (low == high) high += 0.001;
    const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
    for (int i = 0; i < half; ++i) {
      const float pos_freq = std::pow(cfg.rope_theta, static_cast<float>(2 * i) / static_cast<float>(d));
      const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (r.factor * pos_freq);
      const float ramp = std::min(1.0f, std::max(0.0f, (static_cast<float>(i) - lo) / span));
      const float keep = 1.0f - ramp;
      inv[static_cast<size_t>(i)] = interpolation * (1.0f - keep) + extrapolation * keep;
    }
  }
  return inv;
}

float rope_attention_scaling(const LlamaConfig& cfg) {
  const RopeScaling& r = cfg.rope_scaling;
  if (r.type != RopeType::Yarn) return 1.0f;
  if (r.attention_factor > 0.0f) return r.attention_factor;
  auto mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (r.mscale != 0.0f && r.mscale_all_dim != 0.0f)
    return static_cast<float>(mscale(r.factor, r.mscale) / mscale(r.factor, r.mscale_all_dim));
  return static_cast<float>(mscale(r.factor, 1.0));
}

Model make_model(const LlamaConfig& cfg) {
  std::string err = cfg.validate();
  if (!err.empty()) throw std::invalid_argument("invalid Llama config: " + err);
  Model m;
  m.cfg = cfg;
  size_t off = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    TensorInfo t{std::move(name), off, std::move(shape)};
    off += t.numel();
    m.tensors.push_back(std::move(t));
  };
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
  const int64_t Q = cfg.q_dim(), KV = cfg.kv_dim(), D = cfg.head_dim();
  add("model.embed_tokens.weight", {V, H});
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H});
    add(p + "self_attn.q_proj.weight", {Q, H});
    if (cfg.qkv_bias) add(p + "self_attn.q_proj.bias", {Q});
    add(p + "self_attn.k_proj.weight", {KV, H});
    if (cfg.qkv_bias) add(p + "self_attn.k_proj.bias", {KV});
    add(p + "self_attn.v_proj.weight", {KV, H});
    if (cfg.qkv_bias) add(p + "self_attn.v_proj.bias", {KV});
    add(p + "self_attn.o_proj.weight", {H, Q});
    if (cfg.o_bias) add(p + "self_attn.o_proj.bias", {H});
    if (cfg.qk_norm) {
      add(p + "self_attn.q_norm.weight", {D});
      add(p + "self_attn.k_norm.weight", {D});
    }
    add(p + "post_attention_layernorm.weight", {H});
    add(p + "mlp.gate_proj.weight", {I, H});
    add(p + "mlp.up_proj.weight", {I, H});
    add(p + "mlp.down_proj.weight", {H, I});
  }
  add("model.norm.weight", {H});
  if (!cfg.tie_word_embeddings) add("lm_head.weight", {V, H});
  m.params.assign(off, 0.0f);
  return m;
}

Model::Ptrs Model::ptrs(float* buf) const {
  Ptrs p{};
  size_t i = 0;
  auto next = [&]() { return buf + tensors.at(i++).offset; };
  p.embed_tokens = next();
  p.layers.resize(cfg.num_hidden_layers);
  auto maybe = [&](bool present) { return present ? next() : nullptr; };
  for (auto& L : p.layers) {
    L.input_layernorm = next();
    L.q_proj = next();
    L.q_bias = maybe(cfg.qkv_bias);
    L.k_proj = next();
    L.k_bias = maybe(cfg.qkv_bias);
    L.v_proj = next();
    L.v_bias = maybe(cfg.qkv_bias);
    L.o_proj = next();
    L.o_bias = maybe(cfg.o_bias);
    L.q_norm = maybe(cfg.qk_norm);
    L.k_norm = maybe(cfg.qk_norm);
    L.post_attention_layernorm = next();
    L.gate_proj = next();
    L.up_proj = next();
    L.down_proj = next();
  }
  p.norm = next();
  p.lm_head = cfg.tie_word_embeddings ? p.embed_tokens : next();
  return p;
}

const TensorInfo* Model::find(const std::string& name) const {
  for (auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void init_random(Model& m, uint64_t seed, float std) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, std);
  for (auto& t : m.tensors) {
    float* d = m.params.data() + t.offset;
    const bool is_bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    const bool is_norm = t.shape.size() == 1 && !is_bias;
    for (size_t k = 0; k < t.numel(); ++k) d[k] = is_bias ? 0.0f : is_norm ? 1.0f : normal(rng);
  }
}

}  // namespace ooze
