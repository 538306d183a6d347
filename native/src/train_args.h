// Argument parsing shared by the training bindings (train_binding.cc, loss_binding.cc): HF config
// objects, packed batches with per-token arrays, loss and optimizer configs, metrics back to JS.
// JS thread only; every function throws a Napi::TypeError naming the field that is wrong.
#pragma once
#include <napi.h>

#include <cstring>
#include <string>
#include <vector>

#include "config_js.h"
#include "lora.h"
#include "loss.h"
#include "model.h"
#include "optim.h"
#include "train.h"

namespace ooze::train_js {

[[noreturn]] inline void type_error(Napi::Env env, const std::string& msg) { throw Napi::TypeError::New(env, "Trainer: " + msg); }

inline bool present(const Napi::Object& o, const char* k) {
  if (!o.Has(k)) return false;
  Napi::Value v = o.Get(k);
  return !v.IsUndefined() && !v.IsNull();
}

inline double num(const Napi::Object& o, const char* k, double def) {
  if (!present(o, k)) return def;
  Napi::Value v = o.Get(k);
  if (v.IsBoolean()) return v.As<Napi::Boolean>().Value() ? 1 : 0;
  if (!v.IsNumber()) type_error(o.Env(), std::string(k) + " must be a number");
  return v.As<Napi::Number>().DoubleValue();
}

template <typename T>
std::vector<T> typed(const Napi::Object& o, const char* k, napi_typedarray_type type, const char* tname, bool required) {
  if (!present(o, k)) {
    if (required) type_error(o.Env(), std::string(k) + " is required (" + tname + ")");
    return {};
  }
  Napi::Value v = o.Get(k);
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != type)
    type_error(o.Env(), std::string(k) + " must be a " + tname);
  Napi::TypedArray a = v.As<Napi::TypedArray>();
  const T* p = reinterpret_cast<const T*>(static_cast<const uint8_t*>(a.ArrayBuffer().Data()) + a.ByteOffset());
  return std::vector<T>(p, p + a.ElementLength());
}

/** The packed batch plus the per-token training inputs (only tokens and cuSeqlens are required). */
struct BatchArgs {
  PackedBatch b;
  std::vector<uint8_t> loss_mask;
  std::vector<float> advantages, old_logprobs, rollout_logprobs, ref_logprobs;
  std::vector<float> old_values, returns;  // critic: empty unless given
};

inline BatchArgs parse_batch(const Napi::Value& v, bool training) {
  Napi::Env env = v.Env();
  if (!v.IsObject()) type_error(env, "batch must be an object {tokens, cuSeqlens, ...}");
  Napi::Object o = v.As<Napi::Object>();
  BatchArgs a;
  a.b.tokens = typed<int32_t>(o, "tokens", napi_int32_array, "Int32Array", true);
  a.b.cu_seqlens = typed<int32_t>(o, "cuSeqlens", napi_int32_array, "Int32Array", true);
  if (!training) return a;
  const size_t T = a.b.tokens.size();
  a.loss_mask = typed<uint8_t>(o, "lossMask", napi_uint8_array, "Uint8Array", true);
  a.advantages = typed<float>(o, "advantages", napi_float32_array, "Float32Array", true);
  a.old_logprobs = typed<float>(o, "oldLogprobs", napi_float32_array, "Float32Array", true);
  a.rollout_logprobs = typed<float>(o, "rolloutLogprobs", napi_float32_array, "Float32Array", false);
  a.ref_logprobs = typed<float>(o, "refLogprobs", napi_float32_array, "Float32Array", false);
  a.old_values = typed<float>(o, "oldValues", napi_float32_array, "Float32Array", false);
  a.returns = typed<float>(o, "returns", napi_float32_array, "Float32Array", false);
  auto check = [&](size_t n, const char* k, bool opt) {
    if (!(opt && n == 0) && n != T)
      type_error(env, std::string("batch.") + k + " has " + std::to_string(n) + " entries, tokens has " + std::to_string(T));
  };
  check(a.loss_mask.size(), "lossMask", false), check(a.advantages.size(), "advantages", false);
  check(a.old_logprobs.size(), "oldLogprobs", false), check(a.rollout_logprobs.size(), "rolloutLogprobs", true);
  check(a.ref_logprobs.size(), "refLogprobs", true);
  check(a.old_values.size(), "oldValues", true), check(a.returns.size(), "returns", true);
  return a;
}

struct LossArgs {
  LossConfig c;
  float temperature = 1.0f;
};

inline LossArgs parse_loss(const Napi::Value& v) {
  LossArgs a;
  if (v.IsUndefined() || v.IsNull()) return a;
  if (!v.IsObject()) type_error(v.Env(), "lossConfig must be an object");
  Napi::Object o = v.As<Napi::Object>();
  a.c.eps_clip = static_cast<float>(num(o, "epsClip", 0.2));
  a.c.eps_clip_high = static_cast<float>(num(o, "epsClipHigh", a.c.eps_clip));
  a.c.eps_clip_c = static_cast<float>(num(o, "epsClipC", 0));
  a.c.kl_coef = static_cast<float>(num(o, "klCoef", 0));
  a.c.entropy_coef = static_cast<float>(num(o, "entropyCoef", 0));
  a.c.uniform_coef = static_cast<float>(num(o, "uniformCoef", 0));
  a.c.tis_cap = static_cast<float>(num(o, "tisCap", 0));
  a.c.normalizer = num(o, "normalizer", 0);
  a.c.value_coef = static_cast<float>(num(o, "valueCoef", 0));
  // valueClip: null turns the clip off (0); absent means the default 0.2
  a.c.value_clip = o.Has("valueClip") && o.Get("valueClip").IsNull() ? 0.0f : static_cast<float>(num(o, "valueClip", 0.2));
  a.temperature = static_cast<float>(num(o, "temperature", 1.0));
  if (!(a.temperature > 0)) type_error(v.Env(), "lossConfig.temperature must be > 0");
  if (present(o, "klType")) {
    std::string k = o.Get("klType").ToString();
    if (k == "k1") a.c.kl_type = KlType::K1;
    else if (k == "k2") a.c.kl_type = KlType::K2;
    else if (k == "k3") a.c.kl_type = KlType::K3;
    else type_error(v.Env(), "lossConfig.klType must be 'k1', 'k2' or 'k3', got '" + k + "'");
  }
  if (present(o, "reduction")) {
    std::string r = o.Get("reduction").ToString();
    if (r == "token") a.c.reduction = Reduction::Token;
    else if (r == "sample") a.c.reduction = Reduction::Sample;
    else type_error(v.Env(), "lossConfig.reduction must be 'token' or 'sample', got '" + r + "'");
  }
  return a;
}

inline AdamWConfig parse_optim(const Napi::Value& v) {
  AdamWConfig c;
  if (!v.IsObject()) type_error(v.Env(), "optimConfig must be an object {lr, ...}");
  Napi::Object o = v.As<Napi::Object>();
  if (!present(o, "lr")) type_error(v.Env(), "optimConfig.lr is required");
  c.lr = static_cast<float>(num(o, "lr", 0));
  c.beta1 = static_cast<float>(num(o, "beta1", 0.9));
  c.beta2 = static_cast<float>(num(o, "beta2", 0.999));
  c.eps = static_cast<float>(num(o, "eps", 1e-8));
  c.weight_decay = static_cast<float>(num(o, "weightDecay", 0));
  c.max_grad_norm = static_cast<float>(num(o, "maxGradNorm", 1.0));
  std::string err = validate_adamw(c);
  if (!err.empty()) type_error(v.Env(), "optimConfig: " + err);
  return c;
}

/** An adapter's config from {rank, alpha, targets: string[], rslora?}; `where` prefixes errors. */
inline LoraConfig parse_lora_config(const Napi::Object& o, const std::string& where) {
  Napi::Env env = o.Env();
  LoraConfig c;
  const double r = num(o, "rank", 8);
  if (!(r >= 1) || r != static_cast<int>(r)) type_error(env, where + ".rank must be a positive integer");
  c.rank = static_cast<int>(r);
  c.alpha = static_cast<float>(num(o, "alpha", 2.0 * c.rank));
  c.rslora = num(o, "rslora", 0) != 0;
  if (present(o, "targets")) {
    Napi::Value t = o.Get("targets");
    if (!t.IsArray()) type_error(env, where + ".targets must be an array of module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
    Napi::Array a = t.As<Napi::Array>();
    c.targets = 0;
    for (uint32_t i = 0; i < a.Length(); ++i) {
      const std::string name = a.Get(i).ToString();
      const int k = lora_target_from_name(name);
      if (k < 0)
        type_error(env, where + ".targets[" + std::to_string(i) + "] '" + name +
                            "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
      c.targets |= 1u << k;
    }
  }
  const std::string err = c.validate();
  if (!err.empty()) type_error(env, where + ": " + err);
  return c;
}

/** {rank, alpha, targets, rslora} of an adapter config, for JS. */
inline Napi::Object lora_config_to_js(Napi::Env env, const LoraConfig& c) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("rank", c.rank), o.Set("alpha", c.alpha), o.Set("rslora", Napi::Boolean::New(env, c.rslora));
  Napi::Array t = Napi::Array::New(env);
  for (int k = 0; k < kLoraTargets; ++k)
    if (c.has(k)) t.Set(t.Length(), lora_target_name(k));
  o.Set("targets", t);
  return o;
}

inline Napi::Float32Array to_f32(Napi::Env env, const std::vector<float>& v) {
  Napi::Float32Array a = Napi::Float32Array::New(env, v.size());
  if (!v.empty()) std::memcpy(a.Data(), v.data(), v.size() * sizeof(float));
  return a;
}

inline void set_loss_metrics(Napi::Object o, const LossMetrics& m) {
  o.Set("loss", m.loss), o.Set("pgLoss", m.pg_loss), o.Set("kl", m.kl), o.Set("entropy", m.entropy);
  o.Set("clipfrac", m.clipfrac), o.Set("dualClipfrac", m.dual_clipfrac), o.Set("ratioMean", m.ratio_mean);
  o.Set("ratioMin", m.ratio_min), o.Set("ratioMax", m.ratio_max), o.Set("tisMean", m.tis_mean), o.Set("ppoKl", m.ppo_kl);
  o.Set("numTokens", m.num_tokens), o.Set("numSamples", m.num_samples), o.Set("uniformCe", m.uniform_ce);
  o.Set("valueLoss", m.value_loss), o.Set("valueClipfrac", m.value_clipfrac), o.Set("valueMean", m.value_mean);
}

inline void set_optim_result(Napi::Object o, const OptimResult& r) {
  o.Set("gradNorm", r.grad_norm), o.Set("clipCoef", r.clip_coef);
  o.Set("skipped", Napi::Boolean::New(o.Env(), r.skipped)), o.Set("step", static_cast<double>(r.step));
}

}  // namespace ooze::train_js
