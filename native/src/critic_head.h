// The critic's value head beside the policy model: its params, grads, AdamW state and file format
// (value_head.bin), kept outside Model::params so checkpoints stay plain HF checkpoints.
#pragma once
#include <string>
#include <vector>

#include "model.h"
#include "optim.h"

namespace ooze {

/**
 * The critic's value head on the shared trunk (train.h ValueHead): H + 1 floats [w, b], their grads and
 * AdamW moments, with a layout of two tensors so weight decay skips the bias. Empty when the trainer
 * has no critic. Lives outside Model::params, so checkpoints stay plain HF Llama checkpoints.
 */
struct CriticHead {
  std::vector<float> params, grads;
  AdamWState opt;
  std::vector<TensorInfo> layout;
  bool present() const { return !params.empty(); }
  void reset(int hidden) {
    params.assign(hidden + 1, 0.0f), grads.assign(hidden + 1, 0.0f), opt = AdamWState{};
    layout = {TensorInfo{"value_head.weight", 0, {1, hidden}}, TensorInfo{"value_head.bias", static_cast<size_t>(hidden), {1}}};
  }
  void clear() { params.clear(), grads.clear(), opt = AdamWState{}, layout.clear(); }
};

/** Writes the head and its AdamW state to `path` (magic OOZEVHED, format 1) through a temporary file. */
void save_head(const CriticHead& h, const std::string& path);

/** Replaces `h` from a save_head file for a model of hidden size `hidden`; throws naming the file when it does not fit. */
void load_head(CriticHead& h, int hidden, const std::string& path);

}  // namespace ooze
