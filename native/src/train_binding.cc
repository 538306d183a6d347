// JS binding of the native trainer: an ObjectWrap `Trainer` holding a model, its gradient buffer and
// AdamW state. Compute methods return Promises and run in Napi::AsyncWorkers whose Execute() only
// touches the plain C++ state; one compute call at a time (a second one while busy is rejected).
#include <napi.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "critic_head.h"
#include "train_args.h"
#include "lora.h"
#include "loss.h"
#include "model.h"
#include "optim.h"
#include "registry.h"
#include "train.h"

namespace {

using namespace ooze;
using namespace ooze::train_js;

/**
 * A LoRA adapter trained over the frozen base: its params, grads and AdamW moments. While one is set,
 * the model's own grads and moments are not kept (the base never changes by training).
 */
struct AdapterState {
  std::unique_ptr<Lora> lora;
  std::vector<float> grads;
  AdamWState opt;
  bool present() const { return lora != nullptr; }
  LoraView view() const { return LoraView::of(*lora); }
  LoraView grad_view() { return LoraView::of(*lora, grads.data()); }
};

/** Everything a Trainer owns; shared with in-flight workers. */
struct TrainerState {
  std::unique_ptr<Model> model;  // null until constructed with a config or loaded from a directory
  std::vector<float> grads;      // empty while an adapter trains
  AdamWState opt;
  CriticHead head;
  AdapterState adapter;
  std::atomic<bool> busy{false};
  /** The grads (and the head's) are known to be all zero: set by applyGrads and zeroGrads, cleared by whatever adds into them. */
  bool grads_zero = false;
  /**
   * The saved activations of the last forward with a backward, kept so that the next one reuses their
   * memory: allocating them afresh (hundreds of MB for a 0.5B model) costs a page fault per 4 KiB,
   * about a tenth of a training step.
   */
  Activations acts;

  /** Starts training `a` over the frozen base (drops the base's grads and moments). */
  void set_adapter(std::unique_ptr<Lora> a) {
    adapter.grads.assign(a->params.size(), 0.0f);
    adapter.opt = AdamWState{};
    adapter.lora = std::move(a);
    std::vector<float>().swap(grads);
    opt = AdamWState{};
  }
  /** Back to training the whole model. */
  void clear_adapter() {
    adapter = AdapterState{};
    if (model) grads.assign(model->params.size(), 0.0f);
  }
  /** The optimizer state of what trains: the adapter's, or the model's. */
  AdamWState& trainable_opt() { return adapter.present() ? adapter.opt : opt; }
  size_t trainable_size() const { return adapter.present() ? adapter.lora->params.size() : model->params.size(); }
  void zero_grads() {
    std::fill(grads.begin(), grads.end(), 0.0f);
    std::fill(head.grads.begin(), head.grads.end(), 0.0f);
    std::fill(adapter.grads.begin(), adapter.grads.end(), 0.0f);
  }
};

/** The forward's adapter view (null in full mode); `lv` holds it. */
const LoraView* adapter_view(const TrainerState& st, LoraView& lv) {
  if (!st.adapter.present()) return nullptr;
  lv = st.adapter.view();
  return &lv;
}

/**
 * One AdamW step over what trains — the adapter (LoRA) or the whole model — and, when present, the
 * value head (one global gradient norm).
 */
OptimResult optimizer_step(TrainerState& st, const AdamWConfig& c) {
  Model& m = *st.model;
  std::vector<ParamSet> sets;
  if (Lora* a = st.adapter.lora.get())
    sets.push_back(ParamSet{&a->tensors, a->params.size(), a->params.data(), st.adapter.grads.data(), &st.adapter.opt});
  else
    sets.push_back(ParamSet{&m.tensors, m.params.size(), m.params.data(), st.grads.data(), &st.opt});
  if (st.head.present())
    sets.push_back(ParamSet{&st.head.layout, st.head.params.size(), st.head.params.data(), st.head.grads.data(), &st.head.opt});
  OptimResult r = adamw_step_sets(sets, c, /*zero_grads=*/true);
  if (r.skipped) st.zero_grads();
  st.grads_zero = true;
  return r;
}

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

/** ValueHead view of the state's head for one forward/backward (null when there is none). */
struct HeadView {
  ValueHead vh;
  std::vector<float> values, dvalues;
  const ValueHead* get() const { return vh.params ? &vh : nullptr; }
};

void accumulate(TrainerState& st, StepWork& w) {
  const Model& m = *st.model;
  st.grads_zero = false;
  std::string err = validate_batch(w.in.b, m.cfg.vocab_size);
  if (!err.empty()) throw std::invalid_argument("batch: " + err);
  const int T = w.in.b.num_tokens();
  std::vector<float> lp(T), ent(T), dlp(T), dent(T);
  const bool uniform = w.loss.c.uniform_coef > 0;
  std::vector<float> uce(uniform ? T : 0), dunif(uniform ? T : 0);
  Activations& acts = st.acts;
  const bool critic = w.loss.c.value_coef > 0;
  if (critic && !st.head.present())
    throw std::invalid_argument("lossConfig: valueCoef is set but this trainer has no value head (enable the critic first)");
  if (critic && (w.in.old_values.empty() || w.in.returns.empty()))
    throw std::invalid_argument("batch: valueCoef is set, so oldValues and returns are required");
  HeadView hv;
  if (critic) {
    hv.values.resize(T), hv.dvalues.resize(T);
    hv.vh.params = st.head.params.data(), hv.vh.values = hv.values.data();
    hv.vh.dvalues = hv.dvalues.data(), hv.vh.grads = st.head.grads.data();
  }
  LoraView lv, lg;
  const LoraView* lora = adapter_view(st, lv);
  if (lora) lg = st.adapter.grad_view();
  train_forward(m, m.params.data(), w.in.b, w.loss.temperature, lp.data(), ent.data(), &acts, w.in.loss_mask.data(), hv.get(), lora,
                uniform ? uce.data() : nullptr);
  LossInputs li;
  li.T = T, li.cu_seqlens = w.in.b.cu_seqlens.data(), li.num_seqs = w.in.b.num_seqs();
  li.logprobs = lp.data(), li.entropy = ent.data(), li.loss_mask = w.in.loss_mask.data();
  li.uniform_ce = uniform ? uce.data() : nullptr;
  li.advantages = w.in.advantages.data(), li.old_logprobs = w.in.old_logprobs.data();
  li.rollout_logprobs = w.in.rollout_logprobs.empty() ? nullptr : w.in.rollout_logprobs.data();
  li.ref_logprobs = w.in.ref_logprobs.empty() ? nullptr : w.in.ref_logprobs.data();
  if (critic) li.values = hv.values.data(), li.old_values = w.in.old_values.data(), li.returns = w.in.returns.data();
  err = validate_loss(w.loss.c, li);
  if (!err.empty()) throw std::invalid_argument("lossConfig: " + err);
  w.metrics = policy_loss(w.loss.c, li, dlp.data(), dent.data(), uniform ? dunif.data() : nullptr);
  if (critic) value_loss(w.loss.c, li, hv.dvalues.data(), w.metrics);
  train_backward(m, m.params.data(), w.in.b, w.loss.temperature, acts, dlp.data(), dent.data(), lora ? nullptr : st.grads.data(),
                 hv.get(), lora, lora ? &lg : nullptr, uniform ? dunif.data() : nullptr);
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
         InstanceMethod<&TrainerWrap::LoadOptimizer>("loadOptimizer"), InstanceMethod<&TrainerWrap::SetValueHead>("setValueHead"),
         InstanceMethod<&TrainerWrap::GetValueHead>("getValueHead"), InstanceMethod<&TrainerWrap::SaveValueHead>("saveValueHead"),
         InstanceMethod<&TrainerWrap::LoadValueHead>("loadValueHead"), InstanceMethod<&TrainerWrap::SetLora>("setLora"),
         InstanceMethod<&TrainerWrap::GetLora>("getLora"), InstanceMethod<&TrainerWrap::SetLoraParams>("setLoraParams"),
         InstanceMethod<&TrainerWrap::SaveLora>("saveLora"), InstanceMethod<&TrainerWrap::LoadLora>("loadLora")});
    exports.Set("Trainer", cls);
  }

  explicit TrainerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<TrainerWrap>(info) {
    st_ = std::make_shared<TrainerState>();
    if (info.Length() < 1 || info[0].IsUndefined() || info[0].IsNull()) return;  // empty: load() later
    if (!info[0].IsObject()) type_error(info.Env(), "new Trainer({config, params|null, seed|null}) or new Trainer()");
    Napi::Object o = info[0].As<Napi::Object>();
    if (!present(o, "config") || !o.Get("config").IsObject()) type_error(info.Env(), "config (HF config.json fields) is required");
    auto m = std::make_unique<Model>(make_model(config_from_js(info.Env(), o.Get("config"))));
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

  /** logprobs(batch, temperature = 1) -> Promise<{logprobs, entropy, values|null}> (no gradient; values from the value head). */
  Napi::Value Logprobs(const Napi::CallbackInfo& info) {
    auto in = std::make_shared<BatchArgs>(parse_batch(info[0], false));
    const float temp = info.Length() > 1 && info[1].IsNumber() ? info[1].As<Napi::Number>().FloatValue() : 1.0f;
    if (!(temp > 0)) type_error(info.Env(), "temperature must be > 0");
    claim(info.Env(), "logprobs");
    auto lp = std::make_shared<std::vector<float>>(), ent = std::make_shared<std::vector<float>>();
    auto values = std::make_shared<std::vector<float>>();
    auto st = st_;
    const bool critic = st_->head.present();
    return run(
        info,
        [st, in, temp, lp, ent, values, critic] {
          std::string err = validate_batch(in->b, st->model->cfg.vocab_size);
          if (!err.empty()) throw std::invalid_argument("batch: " + err);
          lp->resize(in->b.num_tokens()), ent->resize(in->b.num_tokens());
          ValueHead vh;
          if (critic) values->resize(in->b.num_tokens()), vh.params = st->head.params.data(), vh.values = values->data();
          LoraView lv;
          train_forward(*st->model, st->model->params.data(), in->b, temp, lp->data(), ent->data(), nullptr, nullptr,
                        critic ? &vh : nullptr, adapter_view(*st, lv));
        },
        [lp, ent, values, critic](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("logprobs", to_f32(env, *lp)), o.Set("entropy", to_f32(env, *ent));
          o.Set("values", critic ? to_f32(env, *values) : env.Null());
          return o;
        });
  }

  /**
   * backward(batch, temperature, dLogprobs, dEntropy, dValues?) -> Promise<void>: adds dL/dparams into
   * grads; with dValues (needs a value head) also the value head's gradient, through the trunk.
   */
  Napi::Value Backward(const Napi::CallbackInfo& info) {
    auto in = std::make_shared<BatchArgs>(parse_batch(info[0], false));
    const float temp = info[1].IsNumber() ? info[1].As<Napi::Number>().FloatValue() : 1.0f;
    if (!(temp > 0)) type_error(info.Env(), "temperature must be > 0");
    Napi::Object args = Napi::Object::New(info.Env());
    args.Set("dLogprobs", info[2]), args.Set("dEntropy", info[3]);
    if (info.Length() > 4) args.Set("dValues", info[4]);
    auto dlp = std::make_shared<std::vector<float>>(typed<float>(args, "dLogprobs", napi_float32_array, "Float32Array", true));
    auto dent = std::make_shared<std::vector<float>>(typed<float>(args, "dEntropy", napi_float32_array, "Float32Array", true));
    auto dval = std::make_shared<std::vector<float>>(typed<float>(args, "dValues", napi_float32_array, "Float32Array", false));
    if (dlp->size() != in->b.tokens.size() || dent->size() != in->b.tokens.size() || (!dval->empty() && dval->size() != in->b.tokens.size()))
      type_error(info.Env(), "dLogprobs, dEntropy and dValues need one entry per token");
    if (!dval->empty() && !st_->head.present()) type_error(info.Env(), "backward: dValues given but the trainer has no value head");
    claim(info.Env(), "backward");
    auto st = st_;
    return run(
        info,
        [st, in, temp, dlp, dent, dval] {
          std::string err = validate_batch(in->b, st->model->cfg.vocab_size);
          if (!err.empty()) throw std::invalid_argument("batch: " + err);
          const int T = in->b.num_tokens();
          st->grads_zero = false;
          std::vector<float> lp(T), ent(T);
          Activations& acts = st->acts;
          ValueHead vh;
          if (!dval->empty()) vh.params = st->head.params.data(), vh.dvalues = dval->data(), vh.grads = st->head.grads.data();
          LoraView lv, lg;
          const LoraView* lora = adapter_view(*st, lv);
          if (lora) lg = st->adapter.grad_view();
          train_forward(*st->model, st->model->params.data(), in->b, temp, lp.data(), ent.data(), &acts, nullptr, nullptr, lora);
          train_backward(*st->model, st->model->params.data(), in->b, temp, acts, dlp->data(), dent->data(),
                         lora ? nullptr : st->grads.data(), dval->empty() ? nullptr : &vh, lora, lora ? &lg : nullptr);
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
        [st, w] { w->opt = optimizer_step(*st, w->optim); },
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
          if (!st->grads_zero) st->zero_grads();
          accumulate(*st, *w);
          w->opt = optimizer_step(*st, w->optim);
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
    st_->zero_grads();
    st_->grads_zero = true;
    return info.Env().Undefined();
  }
  Napi::Value GetParams(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "getParams");
    return to_f32(info.Env(), st_->model->params);
  }
  Napi::Value GetGrads(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "getGrads");
    if (st_->adapter.present()) type_error(info.Env(), "getGrads: the base is frozen while a LoRA adapter trains; its grads are getLora().grads");
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
    st_->head.opt = AdamWState{};
    st_->adapter.opt = AdamWState{};
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
    o.Set("step", static_cast<double>(st_->trainable_opt().step));
    o.Set("valueHead", Napi::Boolean::New(env, st_->head.present()));
    if (const Lora* a = st_->adapter.lora.get()) {
      Napi::Object l = lora_config_to_js(env, a->cfg);
      l.Set("numParams", static_cast<double>(a->params.size()));
      o.Set("lora", l);
    } else {
      o.Set("lora", env.Null());
    }
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
        info, [st, path] { save_adamw_state(st->trainable_opt(), st->trainable_size(), path); },
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
          st->trainable_opt() = load_adamw_state(path, st->trainable_size());
          *step = st->trainable_opt().step;
        },
        [step](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("step", static_cast<double>(*step));
          return o;
        });
  }
  /** setValueHead(params: Float32Array of hidden_size + 1) -> void: creates or replaces the critic's value head (grads zeroed, its moments reset). */
  Napi::Value SetValueHead(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "setValueHead");
    Napi::Object args = Napi::Object::New(info.Env());
    args.Set("params", info[0]);
    std::vector<float> p = typed<float>(args, "params", napi_float32_array, "Float32Array", true);
    const int H = st_->model->cfg.hidden_size;
    if (p.size() != static_cast<size_t>(H) + 1)
      type_error(info.Env(), "setValueHead: got " + std::to_string(p.size()) + " floats, the value head has hidden_size + 1 = " + std::to_string(H + 1));
    st_->head.reset(H);
    st_->head.params = std::move(p);
    return info.Env().Undefined();
  }
  /** getValueHead() -> {params, grads, step} | null: copies of the value head, its accumulated grads and AdamW step. */
  Napi::Value GetValueHead(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "getValueHead");
    if (!st_->head.present()) return info.Env().Null();
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("params", to_f32(info.Env(), st_->head.params)), o.Set("grads", to_f32(info.Env(), st_->head.grads));
    o.Set("step", static_cast<double>(st_->head.opt.step));
    return o;
  }
  /** saveValueHead(path) -> Promise<void>: the value head and its AdamW state to one file (kHeadMagic format). */
  Napi::Value SaveValueHead(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsString()) type_error(info.Env(), "saveValueHead(path): path must be a string");
    std::string path = info[0].As<Napi::String>();
    claim(info.Env(), "saveValueHead");
    auto st = st_;
    return run(info, [st, path] { save_head(st->head, path); }, [](Napi::Env env) -> Napi::Value { return env.Undefined(); });
  }
  /** loadValueHead(path) -> Promise<void>: replaces the value head and its AdamW state from a saveValueHead file. */
  Napi::Value LoadValueHead(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsString()) type_error(info.Env(), "loadValueHead(path): path must be a string");
    std::string path = info[0].As<Napi::String>();
    claim(info.Env(), "loadValueHead");
    auto st = st_;
    return run(
        info, [st, path] { load_head(st->head, st->model->cfg.hidden_size, path); },
        [](Napi::Env env) -> Napi::Value { return env.Undefined(); });
  }
  /**
   * setLora({rank, alpha, targets, rslora?, seed?, params?} | null) -> void: trains a new LoRA adapter
   * over the frozen base (PEFT's initialisation from `seed`, or `params` in the adapter's layout), or,
   * with null, the whole model again. Either way grads and optimizer state start empty.
   */
  Napi::Value SetLora(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "setLora");
    if (info.Length() < 1 || info[0].IsNull() || info[0].IsUndefined()) {
      st_->clear_adapter();
      return info.Env().Undefined();
    }
    if (!info[0].IsObject()) type_error(info.Env(), "setLora({rank, alpha, targets, rslora?, seed?, params?} | null)");
    Napi::Object o = info[0].As<Napi::Object>();
    LoraConfig c = parse_lora_config(o, "setLora");
    auto a = std::make_unique<Lora>(make_lora(st_->model->cfg, c));
    if (present(o, "params")) {
      std::vector<float> p = typed<float>(o, "params", napi_float32_array, "Float32Array", true);
      if (p.size() != a->params.size())
        type_error(info.Env(), "setLora: params has " + std::to_string(p.size()) + " floats, this adapter has " + std::to_string(a->params.size()));
      a->params = std::move(p);
    } else {
      init_lora(*a, static_cast<uint64_t>(num(o, "seed", 0)));
    }
    st_->set_adapter(std::move(a));
    return info.Env().Undefined();
  }
  /** getLora() -> {config, params, grads, step, tensors} | null: copies of the adapter being trained. */
  Napi::Value GetLora(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "getLora");
    Napi::Env env = info.Env();
    const Lora* a = st_->adapter.lora.get();
    if (!a) return env.Null();
    Napi::Object o = Napi::Object::New(env);
    o.Set("config", lora_config_to_js(env, a->cfg));
    o.Set("params", to_f32(env, a->params)), o.Set("grads", to_f32(env, st_->adapter.grads));
    o.Set("step", static_cast<double>(st_->adapter.opt.step));
    Napi::Array ts = Napi::Array::New(env, a->tensors.size());
    for (size_t i = 0; i < a->tensors.size(); ++i) {
      Napi::Object t = Napi::Object::New(env);
      t.Set("name", a->tensors[i].name), t.Set("offset", static_cast<double>(a->tensors[i].offset));
      Napi::Array shape = Napi::Array::New(env, 2);
      shape.Set(0u, static_cast<double>(a->tensors[i].shape[0])), shape.Set(1u, static_cast<double>(a->tensors[i].shape[1]));
      t.Set("shape", shape);
      ts.Set(i, t);
    }
    o.Set("tensors", ts);
    return o;
  }
  /** setLoraParams(params) -> void: replaces the adapter's values (its layout, getLora().tensors). */
  Napi::Value SetLoraParams(const Napi::CallbackInfo& info) {
    require_idle(info.Env(), "setLoraParams");
    Lora* a = st_->adapter.lora.get();
    if (!a) type_error(info.Env(), "setLoraParams: no adapter (setLora or loadLora first)");
    Napi::Object args = Napi::Object::New(info.Env());
    args.Set("params", info[0]);
    std::vector<float> p = typed<float>(args, "params", napi_float32_array, "Float32Array", true);
    if (p.size() != a->params.size())
      type_error(info.Env(), "setLoraParams: got " + std::to_string(p.size()) + " floats, the adapter has " + std::to_string(a->params.size()));
    a->params = std::move(p);
    return info.Env().Undefined();
  }
  /** saveLora(dir, weightVersion = "", baseModel = "") -> Promise<void>: the adapter in PEFT's format. */
  Napi::Value SaveLora(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsString()) type_error(info.Env(), "saveLora(dir, weightVersion?, baseModel?): dir must be a string");
    if (!st_->adapter.present()) type_error(info.Env(), "saveLora: no adapter (setLora or loadLora first)");
    const std::string dir = info[0].As<Napi::String>();
    const std::string version = info.Length() > 1 && info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "";
    const std::string base = info.Length() > 2 && info[2].IsString() ? info[2].As<Napi::String>().Utf8Value() : "";
    claim(info.Env(), "saveLora");
    auto st = st_;
    return run(
        info, [st, dir, version, base] { save_lora_dir(*st->adapter.lora, dir, base, version); },
        [](Napi::Env env) -> Napi::Value { return env.Undefined(); });
  }
  /** loadLora(dir) -> Promise<{weightVersion}>: trains the PEFT adapter in `dir` over the frozen base (fresh optimizer). */
  Napi::Value LoadLora(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsString()) type_error(info.Env(), "loadLora(dir): dir must be a string");
    const std::string dir = info[0].As<Napi::String>();
    claim(info.Env(), "loadLora");
    auto st = st_;
    auto version = std::make_shared<std::string>();
    return run(
        info,
        [st, dir, version] { st->set_adapter(std::make_unique<Lora>(load_lora_dir(st->model->cfg, dir, version.get()))); },
        [version](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("weightVersion", *version);
          return o;
        });
  }
  /** load(dir) -> Promise<{weightVersion}>: replaces model, zeroes grads, resets the optimizer, drops the adapter. */
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
          st->opt = AdamWState{};
          st->head.clear();  // the caller loads the directory's value head, if it has one
          st->model = std::move(m);
          st->clear_adapter();  // and its adapter, if it trains one (loadLora)
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
