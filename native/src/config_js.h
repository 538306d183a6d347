// A model config between JavaScript and C++. The JS side has config.json's shape, so both ways go
// through JSON text and checkpoint.cc's one reader and writer: a field (rope scaling, say) is parsed
// and checked in one place for checkpoints, engines and trainers alike.
#pragma once
#include <napi.h>

#include <exception>
#include <string>

#include "checkpoint.h"
#include "model.h"

namespace ooze {

/** A JS config object (config.json fields) → LlamaConfig; a bad field throws a JS Error naming it. */
inline LlamaConfig config_from_js(Napi::Env env, Napi::Value v) {
  if (!v.IsObject()) throw Napi::TypeError::New(env, "config must be an object (config.json fields)");
  Napi::Object json = env.Global().Get("JSON").As<Napi::Object>();
  std::string text = json.Get("stringify").As<Napi::Function>().Call(json, {v}).As<Napi::String>();
  try {
    return config_from_json(parse_json(text, "config"), "config");
  } catch (const std::exception& e) {
    throw Napi::Error::New(env, e.what());
  }
}

/** LlamaConfig → the JS object of its config.json. */
inline Napi::Value config_to_js(Napi::Env env, const LlamaConfig& c) {
  Napi::Object json = env.Global().Get("JSON").As<Napi::Object>();
  return json.Get("parse").As<Napi::Function>().Call(json, {Napi::String::New(env, config_to_json(c))});
}

}  // namespace ooze
