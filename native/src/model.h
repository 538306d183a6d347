// The decoder model's plain C++ structures, shared by inference, training and checkpoint I/O: the HF
// config fields of the Llama-architecture families ooze implements (Llama, Mistral, Qwen2, Qwen3 —
// they differ only in a few flags: biases, q/k norms, head size, sliding window, rotary scaling), and
// all parameters in one flat float buffer with a named tensor layout in Hugging Face naming and
// shapes (Linear weights are [out_features, in_features]).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ooze {

/** How the rotary frequencies are scaled (config.json `rope_scaling` / `rope_parameters.rope_type`). */
enum class RopeType { Default, Linear, Llama3, Yarn };

/**
 * Rotary scaling: `linear` divides every frequency by `factor`; `llama3` divides the low ones, keeps
 * the high ones and blends between; `yarn` blends interpolated and original frequencies over a ramp of
 * dimensions and scales cos/sin by an attention factor.
 */
struct RopeScaling {
  RopeType type = RopeType::Default;
  float factor = 1.0f;
  /** llama3 and yarn. */
  int original_max_position_embeddings = 8192;
  /** llama3 only. */
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  /** yarn only: ramp bounds in rotations, optional mscale pair, explicit factor (0: derived), truncation. */
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float mscale = 0.0f;
  float mscale_all_dim = 0.0f;
  float attention_factor = 0.0f;
  bool truncate = true;
  bool operator==(const RopeScaling& o) const {
    return type == o.type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max_position_embeddings == o.original_max_position_embeddings &&
           beta_fast == o.beta_fast && beta_slow == o.beta_slow && mscale == o.mscale &&
           mscale_all_dim == o.mscale_all_dim && attention_factor == o.attention_factor && truncate == o.truncate;
  }
};

/** The model families (config.json `model_type`); each is a LlamaConfig with its flags set. */
enum class Family { Llama, Mistral, Qwen2, Qwen3 };

/** config.json `model_type` of a family. */
inline const char* model_type_name(Family f) {
  switch (f) {
    case Family::Mistral: return "mistral";
    case Family::Qwen2: return "qwen2";
    case Family::Qwen3: return "qwen3";
    case Family::Llama: break;
  }
  return "llama";
}

/** config.json fields of the Llama-architecture families that ooze reads and writes. */
struct LlamaConfig {
  Family family = Family::Llama;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  int max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  int bos_token_id = 1;
  int eos_token_id = 2;
  /** config.json `head_dim` (Qwen3: 128 whatever the width); 0: hidden_size / num_attention_heads. */
  int head_dim_explicit = 0;
  /** q, k and v projections have biases (Qwen2 always; Llama and Qwen3 with attention_bias). */
  bool qkv_bias = false;
  /** o_proj has a bias (Llama and Qwen3 with attention_bias). */
  bool o_bias = false;
  /** Per-head RMSNorm of q and k (weights [head_dim]) before the rotation (Qwen3). */
  bool qk_norm = false;
  /** Each position attends to the last `sliding_window` positions only (Mistral); 0: all before it. */
  int sliding_window = 0;
  int head_dim() const { return head_dim_explicit > 0 ? head_dim_explicit : hidden_size / num_attention_heads; }
  int q_dim() const { return num_attention_heads * head_dim(); }
  int kv_dim() const { return num_key_value_heads * head_dim(); }
  /** Empty string when valid, else what is wrong. */
  std::string validate() const;
};

/**
 * The rotary inverse frequencies, head_dim / 2 of them, in fp32 as transformers computes them:
 * 1 / theta^(2i/d), then scaled as `rope_scaling` says. Inference and training both rotate with these.
 */
std::vector<float> rope_inv_freq(const LlamaConfig& cfg);

/** The factor cos and sin are multiplied by (yarn's attention factor; 1 for the other types). */
float rope_attention_scaling(const LlamaConfig& cfg);

/** The first position (within its sequence) that a query at `pos` attends to: 0, or the sliding window's start. */
inline int attention_start(const LlamaConfig& cfg, int pos) {
  return cfg.sliding_window > 0 && pos - cfg.sliding_window + 1 > 0 ? pos - cfg.sliding_window + 1 : 0;
}

/** One named tensor inside Model::params. */
struct TensorInfo {
  std::string name;
  size_t offset = 0;  // in floats, into Model::params
  std::vector<int64_t> shape;
  size_t numel() const {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

/** Pointers into the flat buffer for one decoder layer. */
struct LayerPtrs {
  float* input_layernorm;           // [hidden]
  float* q_proj;                    // [heads*head_dim, hidden]
  float* q_bias;                    // [heads*head_dim] or nullptr
  float* k_proj;                    // [kv_heads*head_dim, hidden]
  float* k_bias;                    // [kv_heads*head_dim] or nullptr
  float* v_proj;                    // [kv_heads*head_dim, hidden]
  float* v_bias;                    // [kv_heads*head_dim] or nullptr
  float* o_proj;                    // [hidden, heads*head_dim]
  float* o_bias;                    // [hidden] or nullptr
  float* q_norm;                    // [head_dim] or nullptr
  float* k_norm;                    // [head_dim] or nullptr
  float* post_attention_layernorm;  // [hidden]
  float* gate_proj;                 // [intermediate, hidden]
  float* up_proj;                   // [intermediate, hidden]
  float* down_proj;                 // [hidden, intermediate]
};

/**
 * A model: config plus every parameter in one flat fp32 buffer, laid out in `tensors` order
 * (HF names). A gradient or optimizer-moment buffer of the same size shares the layout, so
 * `ptrs(buffer)` gives the per-tensor views of any of them.
 */
struct Model {
  LlamaConfig cfg;
  std::vector<TensorInfo> tensors;
  std::vector<float> params;

  struct Ptrs {
    float* embed_tokens;  // [vocab, hidden]
    std::vector<LayerPtrs> layers;
    float* norm;     // [hidden]
    float* lm_head;  // [vocab, hidden]; equals embed_tokens when tied
  };
  /** Views into `buf` (params, or a buffer of the same size). */
  Ptrs ptrs(float* buf) const;
  Ptrs ptrs() { return ptrs(params.data()); }
  const TensorInfo* find(const std::string& name) const;
};

/** Builds the tensor layout for `cfg` (no lm_head tensor when tied) and allocates zeroed params. */
Model make_model(const LlamaConfig& cfg);

/**
 * Random initialisation as HF does for Llama: Linear and embedding weights ~ N(0, 0.02²), biases 0,
 * norm weights 1. Deterministic for a seed.
 */
void init_random(Model& m, uint64_t seed, float std = 0.02f);

}  // namespace ooze
