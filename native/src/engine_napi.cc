// JavaScript binding of the inference engine: class Engine (ObjectWrap) whose step(), loadWeights()
// and loadLoraAdapter() run in Napi::AsyncWorkers; Execute() only touches the C++ Engine.
#include <napi.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>

#include "checkpoint.h"
#include "config_js.h"
#include "engine.h"
#include "lora.h"
#include "registry.h"

namespace ooze {
namespace {

SamplingParams sampling_from_js(Napi::Env env, Napi::Value v) {
  SamplingParams sp;
  if (!v.IsObject()) throw Napi::TypeError::New(env, "sampling must be an object");
  Napi::Object o = v.As<Napi::Object>();
  auto num = [&](const char* k, double def) {
    Napi::Value x = o.Get(k);
    if (x.IsUndefined() || x.IsNull()) return def;
    if (!x.IsNumber()) throw Napi::TypeError::New(env, std::string("sampling.") + k + " must be a number");
    return x.As<Napi::Number>().DoubleValue();
  };
  sp.max_new_tokens = static_cast<int>(num("maxNewTokens", -1));
  sp.temperature = static_cast<float>(num("temperature", 1.0));
  sp.top_p = static_cast<float>(num("topP", 1.0));
  sp.top_k = static_cast<int>(num("topK", -1));
  sp.min_new_tokens = static_cast<int>(num("minNewTokens", 0));
  Napi::Value ie = o.Get("ignoreEos");
  sp.ignore_eos = ie.IsBoolean() && ie.As<Napi::Boolean>().Value();
  Napi::Value st = o.Get("stopTokenIds");
  if (st.IsTypedArray() || st.IsArray()) {
    Napi::Object arr = st.As<Napi::Object>();
    uint32_t n = arr.Get("length").As<Napi::Number>().Uint32Value();
    for (uint32_t i = 0; i < n; ++i) sp.stop_token_ids.push_back(arr.Get(i).As<Napi::Number>().Int32Value());
  }
  Napi::Value seed = o.Get("seed");
  if (seed.IsNumber()) {
    double d = seed.As<Napi::Number>().DoubleValue();
    sp.seed = static_cast<uint64_t>(static_cast<int64_t>(std::floor(d)));
  } else {
    std::random_device rd;
    sp.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  if (!(sp.top_p > 0 && sp.top_p <= 1)) throw Napi::RangeError::New(env, "sampling.topP must be in (0, 1]");
  if (!(sp.temperature >= 0)) throw Napi::RangeError::New(env, "sampling.temperature must be >= 0");
  return sp;
}


Napi::Value event_to_js(Napi::Env env, const EngineEvent& e) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("rid", e.rid);
  o.Set("tokenId", e.token);
  o.Set("logprob", static_cast<double>(e.logprob));
  if (e.finish == EngineEvent::None) {
    o.Set("finished", env.Null());
  } else {
    Napi::Object f = Napi::Object::New(env);
    if (e.finish == EngineEvent::Stop) {
      f.Set("type", "stop");
      f.Set("matched", e.finish_value);
    } else if (e.finish == EngineEvent::Length) {
      f.Set("type", "length");
      f.Set("length", e.finish_value);
    } else {
      f.Set("type", "abort");
      f.Set("message", e.message);
    }
    o.Set("finished", f);
  }
  return o;
}

class StepWorker : public Napi::AsyncWorker {
 public:
  StepWorker(Napi::Env env, std::shared_ptr<Engine> eng)
      : Napi::AsyncWorker(env, "ooze.Engine.step"), eng_(std::move(eng)), deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise promise() { return deferred_.Promise(); }
  void Execute() override {
    try {
      events_ = eng_->step();
    } catch (const std::exception& e) {
      SetError(std::string("Engine.step: ") + e.what());
    }
  }
  void OnOK() override {
    Napi::Env env = Env();
    eng_->deliver(events_);  // on the JS thread, after any abort() that came in meanwhile
    Napi::Array arr = Napi::Array::New(env, events_.size());
    for (size_t i = 0; i < events_.size(); ++i) arr.Set(i, event_to_js(env, events_[i]));
    deferred_.Resolve(arr);
  }
  void OnError(const Napi::Error& e) override {
    std::vector<EngineEvent> none;
    eng_->deliver(none);
    deferred_.Reject(e.Value());
  }

 private:
  std::shared_ptr<Engine> eng_;
  Napi::Promise::Deferred deferred_;
  std::vector<EngineEvent> events_;
};

/**
 * Runs `work` off the event loop (it only touches C++ state), then resolves with `result(env)` on the
 * JS thread, or rejects with the exception's message.
 */
class PromiseWorker : public Napi::AsyncWorker {
 public:
  PromiseWorker(Napi::Env env, const char* name, std::function<void()> work, std::function<Napi::Value(Napi::Env)> result)
      : Napi::AsyncWorker(env, name),
        work_(std::move(work)),
        result_(std::move(result)),
        deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise promise() { return deferred_.Promise(); }
  void Execute() override {
    try {
      work_();
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  void OnOK() override { deferred_.Resolve(result_(Env())); }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  std::function<void()> work_;
  std::function<Napi::Value(Napi::Env)> result_;
  Napi::Promise::Deferred deferred_;
};

/** Queues a PromiseWorker and returns its promise. */
Napi::Value queue(Napi::Env env, const char* name, std::function<void()> work, std::function<Napi::Value(Napi::Env)> result) {
  auto* w = new PromiseWorker(env, name, std::move(work), std::move(result));
  Napi::Promise p = w->promise();
  w->Queue();
  return p;
}

/** An adapter name argument: a string, or undefined/null for the base. */
std::string adapter_arg(Napi::Env env, Napi::Value v, const char* usage) {
  if (v.IsUndefined() || v.IsNull()) return "";
  if (!v.IsString()) throw Napi::TypeError::New(env, usage);
  return v.As<Napi::String>();
}

class EngineWrap : public Napi::ObjectWrap<EngineWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Engine",
                       {InstanceMethod("add", &EngineWrap::Add), InstanceMethod("step", &EngineWrap::Step),
                        InstanceMethod("abort", &EngineWrap::Abort), InstanceMethod("running", &EngineWrap::Running),
                        InstanceMethod("flushCache", &EngineWrap::FlushCache),
                        InstanceMethod("cacheStats", &EngineWrap::CacheStats),
                        InstanceMethod("loadWeights", &EngineWrap::LoadWeights),
                        InstanceMethod("forwardLogits", &EngineWrap::ForwardLogits),
                        InstanceMethod("loadLoraAdapter", &EngineWrap::LoadLoraAdapter),
                        InstanceMethod("loadNamedModel", &EngineWrap::LoadNamedModel),
                        InstanceMethod("unloadLoraAdapter", &EngineWrap::UnloadLoraAdapter),
                        InstanceMethod("loraAdapters", &EngineWrap::LoraAdapters),
                        InstanceMethod("config", &EngineWrap::Config), InstanceMethod("close", &EngineWrap::Close)});
  }

  explicit EngineWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<EngineWrap>(info) {
    Napi::Env env = info.Env();
    if (!info[0].IsObject())
      throw Napi::TypeError::New(env, "new Engine({modelDir} | {config, params}, cacheTokens?, maxRunning?)");
    Napi::Object o = info[0].As<Napi::Object>();
    auto opt = [&](const char* k, double def) {
      Napi::Value v = o.Get(k);
      return v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : def;
    };
    Model m;
    try {
      if (o.Get("modelDir").IsString()) {
        m = load_model_dir(o.Get("modelDir").As<Napi::String>());
      } else {
        Napi::Object json = env.Global().Get("JSON").As<Napi::Object>();
        std::string text =
            json.Get("stringify").As<Napi::Function>().Call(json, {o.Get("config")}).As<Napi::String>();
        m = make_model(config_from_json(parse_json(text, "config"), "config"));
        if (!o.Get("params").IsTypedArray()) throw std::invalid_argument("params must be a Float32Array");
        Napi::Float32Array p = o.Get("params").As<Napi::Float32Array>();
        if (p.ElementLength() != m.params.size())
          throw std::invalid_argument("params has " + std::to_string(p.ElementLength()) + " floats; the config needs " +
                                      std::to_string(m.params.size()));
        std::memcpy(m.params.data(), p.Data(), m.params.size() * 4);
      }
      eng_ = std::make_shared<Engine>(std::move(m), static_cast<int>(opt("cacheTokens", 16384)),
                                      static_cast<int>(opt("maxRunning", 64)));
    } catch (const std::exception& e) {
      throw Napi::Error::New(env, e.what());
    }
  }

 private:
  std::shared_ptr<Engine> eng_;

  Engine& eng(Napi::Env env) {
    if (!eng_) throw Napi::Error::New(env, "the engine is closed");
    return *eng_;
  }

  Napi::Value Add(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Engine& e = eng(env);
    if (!info[0].IsString() || !info[1].IsTypedArray())
      throw Napi::TypeError::New(env, "add(rid: string, inputIds: Int32Array, sampling, adapter?: string | null)");
    Napi::TypedArray ta = info[1].As<Napi::TypedArray>();
    if (ta.TypedArrayType() != napi_int32_array) throw Napi::TypeError::New(env, "inputIds must be an Int32Array");
    Napi::Int32Array ids = ta.As<Napi::Int32Array>();
    std::vector<int32_t> prompt(ids.Data(), ids.Data() + ids.ElementLength());
    SamplingParams sp = sampling_from_js(env, info[2]);
    const std::string adapter = adapter_arg(env, info[3], "add: adapter must be a string (a loaded adapter's name) or null");
    try {
      return Napi::Number::New(env, e.add(info[0].As<Napi::String>(), std::move(prompt), sp, adapter));
    } catch (const std::exception& ex) {
      throw Napi::Error::New(env, ex.what());
    }
  }

  Napi::Value Step(const Napi::CallbackInfo& info) {
    eng(info.Env());
    auto* w = new StepWorker(info.Env(), eng_);
    Napi::Promise p = w->promise();
    w->Queue();
    return p;
  }

  Napi::Value Abort(const Napi::CallbackInfo& info) {
    if (!info[0].IsString()) throw Napi::TypeError::New(info.Env(), "abort(rid: string)");
    eng(info.Env()).abort(info[0].As<Napi::String>());
    return info.Env().Undefined();
  }

  Napi::Value Running(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(eng(info.Env()).running()));
  }

  Napi::Value FlushCache(const Napi::CallbackInfo& info) {
    return Napi::Boolean::New(info.Env(), eng(info.Env()).flush_cache());
  }

  Napi::Value CacheStats(const Napi::CallbackInfo& info) {
    EngineCacheStats s = eng(info.Env()).cache_stats();
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("cachedTokens", static_cast<double>(s.cached_tokens));
    o.Set("budgetTokens", static_cast<double>(s.budget_tokens));
    o.Set("promptTokens", static_cast<double>(s.prompt_tokens));
    o.Set("hitTokens", static_cast<double>(s.hit_tokens));
    o.Set("freeSlots", static_cast<double>(s.free_slots));
    return o;
  }

  Napi::Value LoadWeights(const Napi::CallbackInfo& info) {
    eng(info.Env());
    if (!info[0].IsString()) throw Napi::TypeError::New(info.Env(), "loadWeights(dir: string, keepCache?: boolean)");
    std::string dir = info[0].As<Napi::String>();
    const bool keep = info.Length() > 1 && info[1].IsBoolean() && info[1].As<Napi::Boolean>().Value();
    return queue(
        info.Env(), "ooze.Engine.loadWeights", [eng = eng_, dir, keep] { eng->load_weights(load_model_dir(dir), keep); },
        [](Napi::Env env) -> Napi::Value { return env.Undefined(); });
  }

  Napi::Value ForwardLogits(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Engine& e = eng(env);
    if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
      throw Napi::TypeError::New(env, "forwardLogits(tokens: Int32Array, adapter?: string | null)");
    Napi::Int32Array ids = info[0].As<Napi::Int32Array>();
    const std::string adapter = adapter_arg(env, info[1], "forwardLogits: adapter must be a string or null");
    std::vector<float> out;
    try {
      out = e.forward_logits(std::vector<int32_t>(ids.Data(), ids.Data() + ids.ElementLength()), adapter);
    } catch (const std::exception& ex) {
      throw Napi::Error::New(env, ex.what());
    }
    Napi::Float32Array a = Napi::Float32Array::New(env, out.size());
    std::memcpy(a.Data(), out.data(), out.size() * 4);
    return a;
  }

  /**
   * loadLoraAdapter / loadNamedModel: reads `dir` and installs it under `name` off the event loop
   * (`load(engine, name, dir)` returns whether it replaced a loaded name); resolves {replaced}.
   */
  Napi::Value LoadNamed(const Napi::CallbackInfo& info, const char* what,
                        std::function<bool(Engine&, const std::string&, const std::string&)> load) {
    eng(info.Env());
    if (!info[0].IsString() || !info[1].IsString())
      throw Napi::TypeError::New(info.Env(), std::string(what) + "(name: string, dir: string)");
    std::string name = info[0].As<Napi::String>(), dir = info[1].As<Napi::String>();
    auto replaced = std::make_shared<bool>(false);
    return queue(
        info.Env(), what, [eng = eng_, name, dir, replaced, load] { *replaced = load(*eng, name, dir); },
        [replaced](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("replaced", *replaced);
          return o;
        });
  }

  Napi::Value LoadLoraAdapter(const Napi::CallbackInfo& info) {
    // The PEFT files are read against the base's config; the registry swap itself is cheap.
    return LoadNamed(info, "loadLoraAdapter", [](Engine& e, const std::string& name, const std::string& dir) {
      return e.load_adapter(name, load_lora_dir(e.config(), dir));
    });
  }

  Napi::Value LoadNamedModel(const Napi::CallbackInfo& info) {
    return LoadNamed(info, "loadNamedModel", [](Engine& e, const std::string& name, const std::string& dir) {
      return e.load_model(name, load_model_dir(dir));
    });
  }

  Napi::Value UnloadLoraAdapter(const Napi::CallbackInfo& info) {
    if (!info[0].IsString()) throw Napi::TypeError::New(info.Env(), "unloadLoraAdapter(name: string)");
    return Napi::Boolean::New(info.Env(), eng(info.Env()).unload_adapter(info[0].As<Napi::String>()));
  }

  Napi::Value LoraAdapters(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    auto list = eng(env).adapters();
    Napi::Array arr = Napi::Array::New(env, list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const LoraConfig& c = list[i]->lora.cfg;
      const bool full = list[i]->model != nullptr;  // a named whole model: no adapter
      Napi::Object o = Napi::Object::New(env);
      o.Set("name", list[i]->name);
      o.Set("full", full);
      o.Set("rank", full ? 0 : c.rank);
      o.Set("alpha", full ? 0.0 : static_cast<double>(c.alpha));
      o.Set("rslora", !full && c.rslora);
      Napi::Array targets = Napi::Array::New(env);
      for (int t = 0, k = 0; !full && t < kLoraTargets; ++t)
        if (c.has(t)) targets.Set(k++, lora_target_name(t));
      o.Set("targets", targets);
      arr.Set(i, o);
    }
    return arr;
  }

  Napi::Value Config(const Napi::CallbackInfo& info) { return config_to_js(info.Env(), eng(info.Env()).config()); }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    eng_.reset();  // a step in flight keeps its own reference until it ends
    return info.Env().Undefined();
  }
};

void InitEngine(Napi::Env env, Napi::Object exports) { exports.Set("Engine", EngineWrap::Define(env)); }

}  // namespace

OOZE_REGISTER(engine, InitEngine);

}  // namespace ooze
