// Training forward and backward of the model (Llama, Mistral, Qwen2, Qwen3) over packed variable-length sequences: per-token
// logprobs and entropies of the next token at a temperature, the activations the backward needs, and
// the gradient of every parameter (same flat layout as Model::params).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lora.h"
#include "model.h"

namespace ooze {

/**
 * Sequences concatenated into one token array; sequence s is tokens[cu_seqlens[s], cu_seqlens[s+1]).
 * Attention never crosses sequences and positions restart at 0 in each.
 */
struct PackedBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> cu_seqlens;
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_seqs() const { return static_cast<int>(cu_seqlens.size()) - 1; }
};

/** Empty string when the batch is well formed for a vocabulary of `vocab` ids, else what is wrong. */
std::string validate_batch(const PackedBatch& b, int vocab);

/** What one decoder layer's backward needs from its forward. Row-major, T rows. */
struct LayerActs {
  std::vector<float> x_in;   // [T,H] residual stream entering the layer
  std::vector<float> rstd1;  // [T]
  std::vector<float> xn1;    // [T,H] input_layernorm output
  std::vector<float> q_pre;  // [T,Q] before the per-head q norm (qk_norm only)
  std::vector<float> k_pre;  // [T,KV] before the per-head k norm (qk_norm only)
  std::vector<float> rstd_q; // [T,heads] (qk_norm only)
  std::vector<float> rstd_k; // [T,kv_heads] (qk_norm only)
  std::vector<float> q;      // [T,Q] after RoPE
  std::vector<float> k;      // [T,KV] after RoPE
  std::vector<float> v;      // [T,KV]
  std::vector<float> lse;    // [T,heads] log-sum-exp of each attention row (probabilities recomputed)
  std::vector<float> att;    // [T,Q] attention output, input of o_proj
  std::vector<float> h;      // [T,H] residual after attention
  std::vector<float> rstd2;  // [T]
  std::vector<float> xn2;    // [T,H] post_attention_layernorm output
  std::vector<float> gate;   // [T,I] gate_proj output (pre-activation)
  std::vector<float> up;     // [T,I] up_proj output
};

/** Saved activations of a forward over one packed batch. */
struct Activations {
  std::vector<LayerActs> layers;
  std::vector<float> x_final;  // [T,H] residual stream before the final norm
  std::vector<float> rstdf;    // [T]
  std::vector<float> xnf;      // [T,H] final norm output, input of lm_head
  std::vector<float> row_lse;  // [T] log-sum-exp of the lm_head row at token i (predicting i+1); NaN where not computed
  std::vector<float> row_ent;  // [T] that row's entropy (the backward reuses both instead of recomputing them)
};

/**
 * The critic's value head on the shared trunk: V = w·xnf + b over the final norm's output (the input
 * of lm_head), H + 1 floats [w..., b]. values[i] is the value of the state that predicts token i (read
 * at row i − 1, aligned like logprobs), 0 at each sequence's first token.
 */
struct ValueHead {
  const float* params = nullptr;  // [H + 1]
  float* values = nullptr;        // forward: T entries out
  const float* dvalues = nullptr;  // backward: dL/dvalues, T entries
  float* grads = nullptr;          // backward: dL/d(w, b) added here, H + 1 entries
};

/**
 * Forward over a packed batch with weights `params` (Model layout). Writes logprobs[i] =
 * log softmax(logits(tokens[..i-1]) / temperature)[tokens[i]] and entropy[i] (that distribution's
 * entropy) for every token i that is not the first of its sequence, and 0 at each first token.
 * Both outputs have num_tokens() entries. With `acts`, saves what train_backward needs; the logits
 * are never held for more than a chunk of rows. With `want` (num_tokens() flags), only tokens whose
 * flag is set get a logprob and entropy (the others are 0), which skips their lm_head rows.
 * With `lora`, the adapter's term is added to each Linear it targets (the model is base + adapter).
 * With `uniform_ce`, it gets each predicted token's cross-entropy of the uniform distribution against
 * the model's, −(1/V)·Σ_v log π(v) = lse − mean(logits / temperature) (aligned as logprobs).
 */
void train_forward(const Model& m, const float* params, const PackedBatch& b, float temperature,
                   float* logprobs, float* entropy, Activations* acts, const uint8_t* want = nullptr,
                   const ValueHead* head = nullptr, const LoraView* lora = nullptr, float* uniform_ce = nullptr);

/**
 * Backward of train_forward: given dL/dlogprobs and dL/dentropy (num_tokens() entries each, aligned as
 * the forward's outputs), ADDS dL/dparams into `grads` (Model layout, tied lm_head into embed_tokens).
 * With `head` (dvalues, grads set), the value loss's gradient flows into the head and the trunk too.
 * With `lora` (the forward's adapter), its A and B gradients are ADDED into `lora_grads` (a view of a
 * buffer in the adapter's layout). `grads` null freezes the base: no base weight's gradient is computed.
 * With `duniform`, dL/duniform_ce (the forward's uniform cross-entropy) flows back too.
 */
void train_backward(const Model& m, const float* params, const PackedBatch& b, float temperature,
                    const Activations& acts, const float* dlogprobs, const float* dentropy, float* grads,
                    const ValueHead* head = nullptr, const LoraView* lora = nullptr, const LoraView* lora_grads = nullptr,
                    const float* duniform = nullptr);

}  // namespace ooze
