// Tensor layout and random initialisation of the Llama model (see model.h).
#include "model.h"

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
  if (hidden_size % num_attention_heads != 0) return "hidden_size must be divisible by num_attention_heads";
  if (num_attention_heads % num_key_value_heads != 0)
    return "num_attention_heads must be divisible by num_key_value_heads";
  if (head_dim() % 2 != 0) return "head_dim must be even (rotary embeddings)";
  if (max_position_embeddings <= 0) return "max_position_embeddings must be > 0";
  if (rope_scaling.type != RopeType::Default && !(rope_scaling.factor > 0.0f)) return "rope_scaling.factor must be > 0";
  if (rope_scaling.type == RopeType::Llama3) {
    if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) || !(rope_scaling.low_freq_factor > 0.0f))
      return "rope_scaling: llama3 needs 0 < low_freq_factor < high_freq_factor";
    if (rope_scaling.original_max_position_embeddings <= 0) return "rope_scaling.original_max_position_embeddings must be > 0";
  }
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
  return inv;
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
  const int64_t Q = static_cast<int64_t>(cfg.num_attention_heads) * cfg.head_dim();
  const int64_t KV = cfg.kv_dim();
  add("model.embed_tokens.weight", {V, H});
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H});
    add(p + "self_attn.q_proj.weight", {Q, H});
    add(p + "self_attn.k_proj.weight", {KV, H});
    add(p + "self_attn.v_proj.weight", {KV, H});
    add(p + "self_attn.o_proj.weight", {H, Q});
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
  for (auto& L : p.layers) {
    L.input_layernorm = next();
    L.q_proj = next();
    L.k_proj = next();
    L.v_proj = next();
    L.o_proj = next();
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
    bool is_norm = t.shape.size() == 1;
    for (size_t k = 0; k < t.numel(); ++k) d[k] = is_norm ? 1.0f : normal(rng);
  }
}

}  // namespace ooze
