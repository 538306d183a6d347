// LoRA adapters over the decoder's Linear layers (Hu et al. 2021, as Hugging Face PEFT implements it):
// for a targeted weight W [out, in], y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ with A [rank, in], B [out, rank] and
// s = alpha / rank (alpha / √rank with rsLoRA). An adapter is a plain flat float buffer with a named
// layout in PEFT's tensor names, so gradients and AdamW moments share it (like Model::params), and
// it reads and writes PEFT's on-disk format (adapter_config.json + adapter_model.safetensors).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace ooze {

/** The Linear layers an adapter can target, in layout order within a layer. */
enum LoraTarget : int { kLoraQ = 0, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown, kLoraTargets };

/** PEFT's module name of a target ("q_proj" … "down_proj"). */
const char* lora_target_name(int target);

/** The target named `name` ("q_proj", …), or -1. */
int lora_target_from_name(const std::string& name);

/** in_features and out_features of a target's base weight under `cfg`. */
void lora_target_dims(const LlamaConfig& cfg, int target, int* in, int* out);

/** adapter_config.json fields that ooze reads and writes. */
struct LoraConfig {
  int rank = 8;
  float alpha = 16.0f;
  /** Bit t set: target t (LoraTarget) carries an adapter in every layer. */
  uint32_t targets = (1u << kLoraQ) | (1u << kLoraV);
  bool rslora = false;
  float scaling() const;
  bool has(int target) const { return (targets >> target) & 1u; }
  /** Empty string when valid, else what is wrong. */
  std::string validate() const;
};

/** A target's A [rank, in] and B [out, rank] inside a buffer of the adapter's layout; null when not targeted. */
struct LoraPair {
  float* A = nullptr;
  float* B = nullptr;
};

/** One layer's pairs, indexed by LoraTarget. */
struct LoraLayer {
  LoraPair t[kLoraTargets];
};

/**
 * One adapter: config, tensor layout (per layer, per target in LoraTarget order, A then B, named as
 * PEFT saves them: `base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight`) and params.
 */
struct Lora {
  LoraConfig cfg;
  int layers = 0;  // the base's num_hidden_layers
  std::vector<TensorInfo> tensors;
  std::vector<float> params;
  /** Per-layer views into `buf` (params, or a buffer of the same size). */
  std::vector<LoraLayer> ptrs(float* buf) const;
};

/** The layout of an adapter for a base of config `base`, params zeroed. Throws std::invalid_argument when `c` is invalid. */
Lora make_lora(const LlamaConfig& base, const LoraConfig& c);

/** PEFT's default initialisation: A ~ U(−1/√in, 1/√in) (kaiming-uniform, a = √5), B = 0, so the adapter starts as a no-op. */
void init_lora(Lora& a, uint64_t seed);

/**
 * What the compute kernels take: the scaling and per-layer A/B pointers of one adapter (into its params).
 * Null LoraView pointer means "no adapter".
 */
struct LoraView {
  const LoraConfig* cfg = nullptr;
  float scaling = 0;
  std::vector<LoraLayer> layers;
  /** A view of `a`'s params, or of `buf` (its grads, say) laid out like them. */
  static LoraView of(const Lora& a, float* buf = nullptr);
};

/**
 * y[rows, out] += s·(x[rows, in]·Aᵀ)·Bᵀ: one target's adapter added to its base Linear's output.
 * `tmp` is scratch (rows × rank floats); `u_out`, when given, receives x·Aᵀ (rows × rank, unscaled).
 */
void lora_apply(const float* x, int rows, int in, int out, const LoraPair& p, int rank, float s, float* y,
                std::vector<float>& tmp);

/**
 * Backward of lora_apply for upstream dy [rows, out]: dx [rows, in] += s·(dy·B)·A (when dx is not null),
 * grad.B += s·dyᵀ·(x·Aᵀ), grad.A += s·(dy·B)ᵀ·x. `tmp` is scratch.
 */
void lora_backward(const float* x, const float* dy, int rows, int in, int out, const LoraPair& p, const LoraPair& grad,
                   int rank, float s, float* dx, std::vector<float>& tmp);

/**
 * Reads a PEFT adapter directory (adapter_config.json, adapter_model.safetensors or .bin refused) for a
 * base of config `base`. Throws std::runtime_error naming the file and the field or tensor when the
 * adapter does not match the base (shape, targets, rank), uses a PEFT feature ooze does not implement
 * (dropout is accepted and ignored: it is a training-time regulariser), or is malformed. The
 * safetensors metadata's weight_version goes to `weight_version` when given.
 */
Lora load_lora_dir(const LlamaConfig& base, const std::string& dir, std::string* weight_version = nullptr);

/**
 * Writes `dir`/adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, target_modules,
 * use_rslora, base_model_name_or_path) and `dir`/adapter_model.safetensors (F32; `weight_version` in the
 * metadata when non-empty), each through a temporary file and a rename. Creates `dir`.
 */
void save_lora_dir(const Lora& a, const std::string& dir, const std::string& base_model, const std::string& weight_version);

}  // namespace ooze
