// JS binding of the native trainer: an ObjectWrap `Trainer` holding a model, its gradient buffer and
// AdamW state. Compute methods return Promises and run in Napi::AsyncWorkers whose Execute() only
// touches the plain C++ state; one compute call at a time (a second one while busy is rejected).
#include <napi.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "train_args.h"
#include "loss.h"
#include "model.h"
#include "optim.h"
#include "registry.h"
#include "train.h"

namespace {

using namespace ooze;
using namespace ooze::train_js;

/** Everything a Trainer owns; shared with in-flight workers. */
struct TrainerState {
  std::unique_ptr<Model> model;  // null until constructed with a config or loaded from a directory
  std::vector<float> grads;
  AdamWState opt;
  std::atomic<bool> busy{false};
};

// ---- async work ----

/** Runs `work` off the JS thread, then resolves with `result(env)`; clears the busy flag either way. */
class Job : public Napi::AsyncWorker {
 public:
  Job(Napi::Env env, std::shared_ptr<TrainerState> st, Napi::Object self, std::function<void()> work,
      std::function<Napi::Value(Napi::Env)> result)
      : Napi::AsyncWorker(env, "ooze.Trainer"), st_(std::move(st)), deferred_(Napi::Promise::Deferred::New(env)),
        work_(std::move(work)), result_(std::move(result)) {
    self_ = Napi::Persistent(self);
  }
  Napi::Promise Promise() { return deferred_.Promise(); }

  void Execute() override {
    try {
      work_();
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  void OnOK() override {
    st_->busy = false;
    deferred_.Resolve(result_(Env()));
  }
  void OnError(const Napi::Error& e) override {
    st_->busy = false;
    deferred_.Reject(e.Value());
  }

 private:
  std::shared_ptr<TrainerState> st_;
  Napi::Promise::Deferred deferred_;
  Napi::ObjectReference self_;
  std::function<void()> work_;
  std::function<Napi::Value(Napi::Env)> result_;
};

/** Shared state of one accumulate call: forward, loss, backward into grads. */
struct StepWork {
  BatchArgs in;
  LossArgs loss;
  AdamWConfig optim;
  LossMetrics metrics;
  OptimResult opt;
};

void accumulate(TrainerState& st, StepWork& w) {
  const Model& m = *st.model;
  std::string err = validate_batch(w.in.b, m.cfg.vocab_size);
  if (!err.empty()) throw std::invalid_argument("batch: " + err);
  const int T = w.in.b.num_tokens();
  std::vector<float> lp(T), ent(T), dlp(T), dent(T);
  Activations acts;
  train_forward(m, m.params.data(), w.in.b, w.loss.temperature, lp.data(), ent.data(), &acts, w.in.loss_mask.data());
  LossInputs li;
  li.T = T, li.cu_seqlens = w.in.b.cu_seqlens.data(), li.num_seqs = w.in.b.num_seqs();
  li.logprobs = lp.data(), li.entropy = ent.data(), li.loss_mask = w.in.loss_mask.data();
  li.advantages = w.in.advantages.data(), li.old_logprobs = w.in.old_logprobs.data();
  li.rollout_logprobs = w.in.rollout_logprobs.empty() ? nullptr : w.in.rollout_logprobs.data();
  li.ref_logprobs = w.in.ref_logprobs.empty() ? nullptr : w.in.ref_logprobs.data();
  err = validate_loss(w.loss.c, li);
  if (!err.empty()) throw std::invalid_argument("lossConfig: " + err);
  w.metrics = policy_loss(w.loss.c, li, dlp.data(), dent.data());
  train_backward(m, m.params.data(), w.in.b, w.loss.temperature, acts, dlp.data(), dent.data(), st.grads.data());
}

// ---- the class ----

class TrainerWrap : public Napi::ObjectWrap<TrainerWrap> {
 public:
  static void Init(Napi::Env env, Napi::Object exports) {
    Napi::Function cls = DefineClass(
        env, "Trainer",
        {InstanceMethod<&TrainerWrap::Logprobs>("logprobs"), InstanceMethod<&TrainerWrap::Backward>("backward"),
         InstanceMethod<&TrainerWrap::Accumulate>("accumulate"), InstanceMethod<&TrainerWrap::ApplyGrads>("applyGrads"),
         InstanceMethod<&TrainerWrap::TrainStep>("trainStep"), InstanceMethod<&TrainerWrap::ZeroGrads>("zeroGrads"),
         InstanceMethod<&TrainerWrap::GetParams>("getParams"), InstanceMethod<&TrainerWrap::SetParams>("setParams"),
         InstanceMethod<&TrainerWrap::GetGrads>("getGrads"), InstanceMethod<&TrainerWrap::Info>("info"),
         InstanceMethod<&TrainerWrap::ResetOptimizer>("resetOptimizer"), InstanceMethod<&TrainerWrap::Save>("save"),
         InstanceMethod<&TrainerWrap::Load>("load"), InstanceMethod<&TrainerWrap::SaveOptimizer>("saveOptimizer"),
         InstanceMethod<&TrainerWrap::LoadOptimizer>("loadOptimizer")});
    exports.Set("Trainer", cls);
  }

  explicit TrainerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<TrainerWrap>(info) {
    st_ = std::make_shared<TrainerState>();
    if (info.Length() < 1 || info[0].IsUndefined() || info[0].IsNull()) return;  // empty: load() later
    if (!info[0].IsObject()) type_error(info.Env(), "new Trainer({config, params|null, seed|null}) or new Trainer()");
    Napi::Object o = info[0].As<Napi::Object>();
    if (!present(o, "config") || !o.Get("config").IsObject()) type_error(info.Env(), "config (HF config.json fields) is required");
    auto m = std::make_unique<Model>(make_model(parse_config(o.Get("config").As<Napi::Object>())));
    if (present(o, "params")) {
      std::vector<float> p = typed<float>(o, "params", napi_float32_array, "Float32Array", true);
      if (p.size() != m->params.size())
        type_error(info.Env(), "params has " + std::to_string(p.size()) + " floats, the config needs " + std::to_string(m->params.size()));
      m->params = std::move(p);
    } else {
      init_random(*m, static_cast<uint64_t>(num(o, "seed", 0)));
    }
    st_->grads.assign(m->params.size(), 0.0f);
    st_->model = std::move(m);
  }

 private:
  std::shared_ptr<TrainerState> st_;

  /** Marks the trainer busy (throws if it already is or has no model). */
  void claim(Napi::Env env, const char* what, bool need_model = true) {
    if (need_model && !st_->model) type_error(env, std::string(what) + ": no model (construct with a config or load(dir) first)");
    bool expected = false;
    if (!st_->busy.compare_exchange_strong(expected, true))
      throw Napi::Error::New(env, std::string("Trainer.") + what + ": another call is in progress; await it first");
  }
  void require_idle(Napi::Env env, const char* what) {
    if (!st_->model) type_error(env, std::string(what) + ": no model (construct with a config or load(dir) first)");
    if (st_->busy) throw Napi::Error::New(env, std::string("Trainer.") + what + ": another call is in progress; await it first");
  }
  Napi::Value run(const Napi::CallbackInfo& info, std::function<void()> work, std::function<Napi::Value(Napi::Env)> result) {
    Job* job = new Job(info.Env(), st_, info.This().As<Napi::Object>(), std::move(work), std::move(result));
    Napi::Promise p = job->Promise();
    job->Queue();
    return p;
  }

  /** logprobs(batch, temperature = 1) -> Promise<{logprobs, entropy}> (no gradient). */
  Napi::Value Logprobs(const Napi::CallbackInfo& info) {
    auto in = std::make_shared<BatchArgs>(parse_batch(info[0], false));
    const float temp = info.Length() > 1 && info[1].IsNumber() ? info[1].As<Napi::Number>().FloatValue() : 1.0f;
    if (!(temp > 0)) type_error(info.Env(), "temperature must be > 0");
    claim(info.Env(), "logprobs");
    auto lp = std::make_shared<std::vector<float>>(), ent = std::make_shared<std::vector<float>>();
    auto st = st_;
    return run(
        info,
        [st, in, temp, lp, ent] {
          std::string err = validate_batch(in->b, st->model->cfg.vocab_size);
          if (!err.empty()) throw std::invalid_argument("batch: " + err);
          lp->resize(in->b.num_tokens()), ent->resize(in->b.num_tokens());
          train_forward(*st->model, st->model->params.data(), in->b, temp, lp->data(), ent->data(), nullptr);
        },
        [lp, ent](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("logprobs", to_f32(env, *lp)), o.Set("entropy", to_f32(env, *ent));
          return o;
        });
  }

  /** backward(batch, temperature, dLogprobs, dEntropy) -> Promise<void>: adds dL/dparams into grads. */
  Napi::Value Backward(const Napi::CallbackInfo& info) {
    auto in = std::make_shared<BatchArgs>(parse_batch(info[0], false));
    const float temp = info[1].IsNumber() ? info[1].As<Napi::Number>().FloatValue() : 1.0f;
    if (!(temp > 0)) type_error(info.Env(), "temperature must be > 0");
    Napi::Object args = Napi::Object::New(info.Env());
    args.Set("dLogprobs", info[2]), args.Set("dEntropy", info[3]);
    auto dlp = std::make_shared<std::vector<float>>(typed<float>(args, "dLogprobs", napi_float32_array, "Float32Array", true));
    auto dent = std::make_shared<std::vector<float>>(typed<float>(args, "dEntropy", napi_float32_array, "Float32Array", true));
    if (dlp->size() != in->b.tokens.size() || dent->size() != in->b.tokens.size())
      type_error(info.Env(), "dLogprobs and dEntropy need one entry per token");
    claim(info.Env(), "backward");
    auto st = st_;
    return run(
        info,
        [st, in, temp, dlp, dent] {
          std::string err = validate_batch(in->b, st->model->cfg.vocab_size);
          if (!err.empty()) throw std::invalid_argument("batch: " + err);
          const int T = in->b.num_tokens();
          std::vector<float> lp(T), ent(T);
          Activations acts;
          train_forward(*st->model, st->model->params.data(), in->b, temp, lp.data(), ent.data(), &acts);
          train_backward(*st->model, st->model->params.data(), in->b, temp, acts, dlp->data(), dent->data(), st->grads.data());
        },
        [](Napi::Env env) -> Napi::Value { return env.Undefined(); });
  }

  /** accumulate(batch, lossConfig) -> Promise<LossMetrics>: forward, loss, backward added into grads. */
  Napi::Value Accumulate(const Napi::CallbackInfo& info) {
    auto w = std::make_shared<StepWork>();
    w->in = parse_batch(info[0], true);
    w->loss = parse_loss(info[1]);
    claim(info.Env(), "accumulate");
    auto st = st_;
    return run(
        info, [st, w] { accumulate(*st, *w); },
        [w](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          set_loss_metrics(o, w->metrics);
          return o;
        });
  }

  /** applyGrads(optimConfig) -> Promise<OptimResult>: clip, AdamW step, zero the grads. */
  Napi::Value ApplyGrads(const Napi::CallbackInfo& info) {
    auto w = std::make_shared<StepWork>();
    w->optim = parse_optim(info[0]);
    claim(info.Env(), "applyGrads");
    auto st = st_;
    return run(
        info,
        [st, w] {
          w->opt = adamw_step(*st->model, st->model->params.data(), st->grads.data(), st->opt, w->optim);
          std::fill(st->grads.begin(), st->grads.end(), 0.0f);
        },
        [w](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          set_optim_result(o, w->opt);
          return o;
        });
  }

  /** trainStep(batch, lossConfig, optimConfig) -> Promise<LossMetrics & OptimResult>. */
  Napi::Value TrainStep(const Napi::CallbackInfo& info) {
    auto w = std::make_shared<StepWork>();
    w->in = parse_batch(info[0], true);
    w->loss = parse_loss(info[1]);
    w->optim = parse_optim(info[2]);
    claim(info.Env(), "trainStep");
    auto st = st_;
    return run(
        info,
        [st, w] {
          std::fill(st->grads.begin(), st->grads.end(), 0.0f);
          accumulate(*st, *w);
          w->opt = adamw_step(*st->model, st->model->params.data(), st->grads.data(), st->opt, w->optim);
          std::fill(st->grads.begin(), st->grads.end(), 0.0f);
        },
        [w](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          set_loss_metrics(o, w->metrics);
          set_optim_result(o, w->opt);
          return o;
        });
  }

  Napi::Value ZeroGrads(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "zeroGrads");
    std::fill(st_->grads.begin(), st_->grads.end(), 0.0f);
    return info.Env().Undefined();
  }
  Napi::Value GetParams(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "getParams");
    return to_f32(info.Env(), st_->model->params);
  }
  Napi::Value GetGrads(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "getGrads");
    return to_f32(info.Env(), st_->grads);
  }
  Napi::Value SetParams(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "setParams");
    Napi::Object args = Napi::Object::New(info.Env());
    args.Set("params", info[0]);
    std::vector<float> p = typed<float>(args, "params", napi_float32_array, "Float32Array", true);
    if (p.size() != st_->model->params.size())
      type_error(info.Env(), "setParams: got " + std::to_string(p.size()) + " floats, the model has " +
                                 std::to_string(st_->model->params.size()));
    st_->model->params = std::move(p);
    return info.Env().Undefined();
  }
  Napi::Value ResetOptimizer(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "resetOptimizer");
    st_->opt = AdamWState{};
    return info.Env().Undefined();
  }
  /** info() -> {config, numParams, step, tensors: [{name, offset, shape}]}. */
  Napi::Value Info(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!st_->model) return env.Null();
    const Model& m = *st_->model;
    Napi::Object o = Napi::Object::New(env);
    o.Set("config", config_to_js(env, m.cfg));
    o.Set("numParams", static_cast<double>(m.params.size()));
    o.Set("step", static_cast<double>(st_->opt.step));
    Napi::Array ts = Napi::Array::New(env, m.tensors.size());
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      Napi::Object t = Napi::Object::New(env);
      t.Set("name", m.tensors[i].name), t.Set("offset", static_cast<double>(m.tensors[i].offset));
      Napi::Array shape = Napi::Array::New(env, m.tensors[i].shape.size());
      for (size_t k = 0; k < m.tensors[i].shape.size(); ++k) shape.Set(k, static_cast<double>(m.tensors[i].shape[k]));
      t.Set("shape", shape);
      ts.Set(i, t);
    }
    o.Set("tensors", ts);
    return o;
  }
  /** save(dir, weightVersion = "") -> Promise<void>: HF checkpoint of the current params. */
  Napi::Value Save(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsString()) type_error(info.Env(), "save(dir, weightVersion?): dir must be a string");
    std::string dir = info[0].As<Napi::String>(), version = info.Length() > 1 && info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "";
    claim(info.Env(), "save");
    auto st = st_;
    return run(
        info, [st, dir, version] { save_model_dir(*st->model, dir, version); },
        [](Napi::Env env) -> Napi::Value { return env.Undefined(); });
  }
  /** saveOptimizer(path) -> Promise<void>: AdamW moments and step to one file. */
  Napi::Value SaveOptimizer(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsString()) type_error(info.Env(), "saveOptimizer(path): path must be a string");
    std::string path = info[0].As<Napi::String>();
    claim(info.Env(), "saveOptimizer");
    auto st = st_;
    return run(
        info, [st, path] { save_adamw_state(st->opt, st->model->params.size(), path); },
        [](Napi::Env env) -> Napi::Value { return env.Undefined(); });
  }
  /** loadOptimizer(path) -> Promise<{step}>: replaces the AdamW state (same parameter count). */
  Napi::Value LoadOptimizer(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsString()) type_error(info.Env(), "loadOptimizer(path): path must be a string");
    std::string path = info[0].As<Napi::String>();
    claim(info.Env(), "loadOptimizer");
    auto st = st_;
    auto step = std::make_shared<int64_t>(0);
    return run(
        info,
        [st, path, step] {
          st->opt = load_adamw_state(path, st->model->params.size());
          *step = st->opt.step;
        },
        [step](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("step", static_cast<double>(*step));
          return o;
        });
  }
  /** load(dir) -> Promise<{weightVersion}>: replaces model, zeroes grads, resets the optimizer. */
  Napi::Value Load(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsString()) type_error(info.Env(), "load(dir): dir must be a string");
    std::string dir = info[0].As<Napi::String>();
    claim(info.Env(), "load", false);
    auto st = st_;
    auto version = std::make_shared<std::string>();
    return run(
        info,
        [st, dir, version] {
          LoadedInfo li;
          auto m = std::make_unique<Model>(load_model_dir(dir, &li));
          *version = li.weight_version;
          st->grads.assign(m->params.size(), 0.0f);
          st->opt = AdamWState{};
          st->model = std::move(m);
        },
        [version](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("weightVersion", *version);
          return o;
        });
  }
};

void init(Napi::Env env, Napi::Object exports) { TrainerWrap::Init(env, exports); }

}  // namespace

OOZE_REGISTER(trainer, init);
