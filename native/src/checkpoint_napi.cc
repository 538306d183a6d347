// JS exports of checkpoint I/O: loadModelDir, saveModelDir, initModelParams, modelLayout (types in
// native/index.d.ts). Configs cross as HF config.json objects, via JSON text and our reader.
#include <napi.h>

#include <cstring>

#include "checkpoint.h"
#include "config_js.h"
#include "registry.h"

namespace ooze {

namespace {


Napi::Array tensors_to_js(Napi::Env env, const Model& m) {
  Napi::Array arr = Napi::Array::New(env, m.tensors.size());
  for (size_t k = 0; k < m.tensors.size(); ++k) {
    const TensorInfo& t = m.tensors[k];
    Napi::Object o = Napi::Object::New(env);
    o.Set("name", t.name);
    o.Set("offset", static_cast<double>(t.offset));
    Napi::Array shape = Napi::Array::New(env, t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) shape.Set(d, static_cast<double>(t.shape[d]));
    o.Set("shape", shape);
    arr.Set(k, o);
  }
  return arr;
}

Napi::Float32Array params_to_js(Napi::Env env, const std::vector<float>& p) {
  Napi::Float32Array a = Napi::Float32Array::New(env, p.size());
  std::memcpy(a.Data(), p.data(), p.size() * 4);
  return a;
}

Napi::Value LoadModelDirJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsString()) throw Napi::TypeError::New(env, "loadModelDir(dir: string)");
  LoadedInfo li;
  Model m;
  try {
    m = load_model_dir(info[0].As<Napi::String>(), &li);
  } catch (const std::exception& e) {
    throw Napi::Error::New(env, e.what());
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("config", config_to_js(env, m.cfg));
  out.Set("params", params_to_js(env, m.params));
  out.Set("tensors", tensors_to_js(env, m));
  out.Set("weightVersion", li.weight_version.empty() ? env.Null() : Napi::String::New(env, li.weight_version));
  return out;
}

Napi::Value SaveModelDirJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsString() || !info[2].IsTypedArray())
    throw Napi::TypeError::New(env, "saveModelDir(dir: string, config: object, params: Float32Array, weightVersion?: string | null)");
  Model m = make_model(config_from_js(env, info[1]));
  Napi::Float32Array p = info[2].As<Napi::Float32Array>();
  if (p.ElementLength() != m.params.size())
    throw Napi::RangeError::New(env, "saveModelDir: params has " + std::to_string(p.ElementLength()) +
                                         " floats but the config needs " + std::to_string(m.params.size()));
  std::memcpy(m.params.data(), p.Data(), m.params.size() * 4);
  std::string wv = info.Length() > 3 && info[3].IsString() ? std::string(info[3].As<Napi::String>()) : "";
  try {
    save_model_dir(m, info[0].As<Napi::String>(), wv);
  } catch (const std::exception& e) {
    throw Napi::Error::New(env, e.what());
  }
  return env.Undefined();
}

Napi::Value InitModelParamsJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Model m = make_model(config_from_js(env, info[0]));
  double seed = info.Length() > 1 && info[1].IsNumber() ? info[1].As<Napi::Number>().DoubleValue() : 0;
  double std = info.Length() > 2 && info[2].IsNumber() ? info[2].As<Napi::Number>().DoubleValue() : 0.02;
  init_random(m, static_cast<uint64_t>(seed), static_cast<float>(std));
  return params_to_js(env, m.params);
}

Napi::Value ModelLayoutJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  LlamaConfig cfg = config_from_js(env, info[0]);
  Model m = make_model(cfg);
  Napi::Object out = Napi::Object::New(env);
  out.Set("config", config_to_js(env, cfg));
  out.Set("numel", static_cast<double>(m.params.size()));
  out.Set("tensors", tensors_to_js(env, m));
  return out;
}

void InitCheckpoint(Napi::Env env, Napi::Object exports) {
  exports.Set("loadModelDir", Napi::Function::New(env, LoadModelDirJs, "loadModelDir"));
  exports.Set("saveModelDir", Napi::Function::New(env, SaveModelDirJs, "saveModelDir"));
  exports.Set("initModelParams", Napi::Function::New(env, InitModelParamsJs, "initModelParams"));
  exports.Set("modelLayout", Napi::Function::New(env, ModelLayoutJs, "modelLayout"));
}

}  // namespace

OOZE_REGISTER(checkpoint, InitCheckpoint);

}  // namespace ooze
