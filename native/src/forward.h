// The Llama decoder's inference forward pass over a batch of sequence chunks (prefill chunks and
// single decode tokens together), reading and writing keys/values in a token-slot KV pool.
#pragma once
#include <cstdint>
#include <vector>

#include "lora.h"
#include "model.h"

namespace ooze {

/** Keys and values of every cached token: [layers][slots][kv_dim] each. A token owns one slot. */
struct KvPool {
  int layers = 0, slots = 0, kv_dim = 0;
  std::vector<float> k, v;
  void init(int n_layers, int n_slots, int dim);
  float* key(int layer, int slot) { return k.data() + (static_cast<size_t>(layer) * slots + slot) * kv_dim; }
  float* value(int layer, int slot) { return v.data() + (static_cast<size_t>(layer) * slots + slot) * kv_dim; }
};

/** Rotary embedding tables, cos/sin [max_position][head_dim/2], computed as HF does in fp32. */
struct RopeTable {
  int half = 0, positions = 0;
  std::vector<float> cos, sin;
  void init(const LlamaConfig& cfg);
};

/** One sequence's part of a forward step: `n` new tokens at positions start..start+n-1. */
struct SeqChunk {
  const int32_t* tokens = nullptr;  // the n new tokens
  int n = 0;
  int start = 0;                    // tokens of this sequence already in the KV pool
  const int32_t* slots = nullptr;   // slot of every position 0..start+n-1
  const LoraView* lora = nullptr;   // the adapter over the base for this chunk's rows; null: the base alone
};

/** Scratch buffers reused between steps. */
struct Workspace {
  std::vector<float> x, h, q, k, v, att, g, u, out_h;
  std::vector<float> lora_tmp;  // lora_apply's scratch
};

/**
 * Runs the decoder over every chunk's rows at once (the Linear layers as one matmul over all rows),
 * stores each new token's key/value in its slot, and writes logits [n_out, vocab]: the last row of
 * each chunk, or every row when `all_rows`. A chunk with an adapter gets s·B·A·x added to each
 * targeted Linear's output (bias included, as PEFT adds it) on its own rows only.
 */
void forward_step(const Model& m, const RopeTable& rope, KvPool& kv, const std::vector<SeqChunk>& chunks,
                  bool all_rows, Workspace& ws, std::vector<float>& logits);

/** Logits [n, vocab] of every position of `tokens` from a fresh cache, under `lora` when given (debug and tests). */
std::vector<float> forward_full(const Model& m, const int32_t* tokens, int n, const LoraView* lora = nullptr);

}  // namespace ooze
