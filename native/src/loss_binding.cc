// JS binding of the policy loss alone: policyLoss(inputs, lossConfig), synchronous, the same code the
// Trainer runs (loss.h), for tests and for callers that compute logprobs elsewhere.
#include <napi.h>

#include <string>
#include <vector>

#include "loss.h"
#include "registry.h"
#include "train_args.h"

namespace {

using namespace ooze;
using namespace ooze::train_js;

/**
 * policyLoss(inputs, lossConfig) -> {metrics, dLogprobs, dEntropy, dUniform}: the native loss alone,
 * synchronous (inputs: {cuSeqlens, logprobs, entropy, lossMask, advantages, oldLogprobs,
 * rolloutLogprobs|null, refLogprobs|null, uniformCe|null}, per-token arrays of one length).
 */
Napi::Value PolicyLossJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) type_error(env, "policyLoss(inputs, lossConfig): inputs must be an object");
  Napi::Object o = info[0].As<Napi::Object>();
  std::vector<int32_t> cu = typed<int32_t>(o, "cuSeqlens", napi_int32_array, "Int32Array", true);
  std::vector<float> lp = typed<float>(o, "logprobs", napi_float32_array, "Float32Array", true);
  std::vector<float> ent = typed<float>(o, "entropy", napi_float32_array, "Float32Array", true);
  std::vector<uint8_t> mask = typed<uint8_t>(o, "lossMask", napi_uint8_array, "Uint8Array", true);
  std::vector<float> adv = typed<float>(o, "advantages", napi_float32_array, "Float32Array", true);
  std::vector<float> old = typed<float>(o, "oldLogprobs", napi_float32_array, "Float32Array", true);
  std::vector<float> roll = typed<float>(o, "rolloutLogprobs", napi_float32_array, "Float32Array", false);
  std::vector<float> ref = typed<float>(o, "refLogprobs", napi_float32_array, "Float32Array", false);
  std::vector<float> uce = typed<float>(o, "uniformCe", napi_float32_array, "Float32Array", false);
  const size_t T = lp.size();
  if (ent.size() != T || mask.size() != T || adv.size() != T || old.size() != T || (!roll.empty() && roll.size() != T) ||
      (!ref.empty() && ref.size() != T) || (!uce.empty() && uce.size() != T))
    type_error(env, "policyLoss: every per-token array needs the same length as logprobs (" + std::to_string(T) + ")");
  if (cu.size() < 2 || cu.front() != 0 || static_cast<size_t>(cu.back()) != T)
    type_error(env, "policyLoss: cuSeqlens must start at 0 and end at " + std::to_string(T));
  for (size_t s = 1; s < cu.size(); ++s)
    if (cu[s] < cu[s - 1]) type_error(env, "policyLoss: cuSeqlens decreases at index " + std::to_string(s));
  LossArgs la = parse_loss(info[1]);
  LossInputs li;
  li.T = static_cast<int>(T), li.cu_seqlens = cu.data(), li.num_seqs = static_cast<int>(cu.size()) - 1;
  li.logprobs = lp.data(), li.entropy = ent.data(), li.loss_mask = mask.data(), li.advantages = adv.data();
  li.old_logprobs = old.data(), li.rollout_logprobs = roll.empty() ? nullptr : roll.data();
  li.ref_logprobs = ref.empty() ? nullptr : ref.data();
  li.uniform_ce = uce.empty() ? nullptr : uce.data();
  std::string err = validate_loss(la.c, li);
  if (!err.empty()) type_error(env, "policyLoss: lossConfig: " + err);
  std::vector<float> dlp(T), dent(T), dunif(T);
  LossMetrics m = policy_loss(la.c, li, dlp.data(), dent.data(), dunif.data());
  Napi::Object r = Napi::Object::New(env), mo = Napi::Object::New(env);
  set_loss_metrics(mo, m);
  r.Set("metrics", mo), r.Set("dLogprobs", to_f32(env, dlp)), r.Set("dEntropy", to_f32(env, dent));
  r.Set("dUniform", to_f32(env, dunif));
  return r;
}

/**
 * valueLoss(inputs, lossConfig) -> {metrics: {valueLoss, valueClipfrac, valueMean, loss}, dValues}: the
 * critic's clipped value loss alone (inputs: {cuSeqlens, lossMask, values, oldValues, returns}).
 */
Napi::Value ValueLossJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) type_error(env, "valueLoss(inputs, lossConfig): inputs must be an object");
  Napi::Object o = info[0].As<Napi::Object>();
  std::vector<int32_t> cu = typed<int32_t>(o, "cuSeqlens", napi_int32_array, "Int32Array", true);
  std::vector<uint8_t> mask = typed<uint8_t>(o, "lossMask", napi_uint8_array, "Uint8Array", true);
  std::vector<float> v = typed<float>(o, "values", napi_float32_array, "Float32Array", true);
  std::vector<float> old = typed<float>(o, "oldValues", napi_float32_array, "Float32Array", true);
  std::vector<float> ret = typed<float>(o, "returns", napi_float32_array, "Float32Array", true);
  const size_t T = mask.size();
  if (v.size() != T || old.size() != T || ret.size() != T)
    type_error(env, "valueLoss: values, oldValues and returns need the same length as lossMask (" + std::to_string(T) + ")");
  if (cu.size() < 2 || cu.front() != 0 || static_cast<size_t>(cu.back()) != T)
    type_error(env, "valueLoss: cuSeqlens must start at 0 and end at " + std::to_string(T));
  LossArgs la = parse_loss(info[1]);
  if (!(la.c.value_coef > 0)) la.c.value_coef = 1.0f;
  LossInputs li;
  li.T = static_cast<int>(T), li.cu_seqlens = cu.data(), li.num_seqs = static_cast<int>(cu.size()) - 1;
  li.loss_mask = mask.data(), li.values = v.data(), li.old_values = old.data(), li.returns = ret.data();
  std::vector<float> dv(T);
  LossMetrics m;
  value_loss(la.c, li, dv.data(), m);
  Napi::Object r = Napi::Object::New(env), mo = Napi::Object::New(env);
  mo.Set("loss", m.loss), mo.Set("valueLoss", m.value_loss), mo.Set("valueClipfrac", m.value_clipfrac), mo.Set("valueMean", m.value_mean);
  r.Set("metrics", mo), r.Set("dValues", to_f32(env, dv));
  return r;
}

void init(Napi::Env env, Napi::Object exports) {
  exports.Set("policyLoss", Napi::Function::New(env, PolicyLossJs, "policyLoss"));
  exports.Set("valueLoss", Napi::Function::New(env, ValueLossJs, "valueLoss"));
}

}  // namespace

OOZE_REGISTER(policy_loss, init);
