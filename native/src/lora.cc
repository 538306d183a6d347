// LoRA adapters (see lora.h): layout in PEFT's names, PEFT's initialisation, the adapter's forward and
// backward through the shared matmul kernels, and PEFT's on-disk format.
#include "lora.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <stdexcept>

#include "checkpoint.h"
#include "kernels.h"

namespace fs = std::filesystem;

namespace ooze {

namespace {
constexpr const char* kTargetNames[kLoraTargets] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

/** The module path of a target inside a decoder layer (HF naming). */
std::string module_of(int layer, int target) {
  const char* block = target <= kLoraO ? "self_attn" : "mlp";
  return "base_model.model.model.layers." + std::to_string(layer) + "." + block + "." + kTargetNames[target];
}
}  // namespace

const char* lora_target_name(int target) { return target >= 0 && target < kLoraTargets ? kTargetNames[target] : "?"; }

int lora_target_from_name(const std::string& name) {
  for (int t = 0; t < kLoraTargets; ++t)
    if (name == kTargetNames[t]) return t;
  return -1;
}

void lora_target_dims(const LlamaConfig& c, int target, int* in, int* out) {
  const int H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
  switch (target) {
    case kLoraQ: *in = H, *out = Q; return;
    case kLoraK: case kLoraV: *in = H, *out = KV; return;
    case kLoraO: *in = Q, *out = H; return;
    case kLoraGate: case kLoraUp: *in = H, *out = I; return;
    case kLoraDown: *in = I, *out = H; return;
    default: throw std::invalid_argument("lora: no target " + std::to_string(target));
  }
}

float LoraConfig::scaling() const {
  return rslora ? alpha / std::sqrt(static_cast<float>(rank)) : alpha / static_cast<float>(rank);
}

std::string LoraConfig::validate() const {
  if (rank <= 0) return "rank (r) must be a positive integer, got " + std::to_string(rank);
  if (!(alpha > 0) || !std::isfinite(alpha)) return "alpha (lora_alpha) must be > 0";
  if (targets == 0) return "targets (target_modules) must name at least one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";
  if (targets >> kLoraTargets) return "targets has bits beyond the 7 known modules";
  return "";
}

std::vector<LoraLayer> Lora::ptrs(float* buf) const {
  // Layout: per layer, per target in order, A then B (make_lora).
  std::vector<LoraLayer> out;
  size_t k = 0;
  out.resize(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      if (!cfg.has(t)) continue;
      out[l].t[t].A = buf + tensors[k++].offset;
      out[l].t[t].B = buf + tensors[k++].offset;
    }
  return out;
}

Lora make_lora(const LlamaConfig& base, const LoraConfig& c) {
  const std::string err = c.validate();
  if (!err.empty()) throw std::invalid_argument("lora: " + err);
  Lora a;
  a.cfg = c;
  a.layers = base.num_hidden_layers;
  size_t off = 0;
  for (int l = 0; l < base.num_hidden_layers; ++l)
    for (int t = 0; t < kLoraTargets; ++t) {
      if (!c.has(t)) continue;
      int in = 0, out = 0;
      lora_target_dims(base, t, &in, &out);
      const std::string m = module_of(l, t);
      a.tensors.push_back(TensorInfo{m + ".lora_A.weight", off, {c.rank, in}});
      off += static_cast<size_t>(c.rank) * in;
      a.tensors.push_back(TensorInfo{m + ".lora_B.weight", off, {out, c.rank}});
      off += static_cast<size_t>(out) * c.rank;
    }
  a.params.assign(off, 0.0f);
  return a;
}

void init_lora(Lora& a, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& t : a.tensors) {
    float* p = a.params.data() + t.offset;
    const size_t n = t.numel();
    static const std::string kA = ".lora_A.weight";
    if (t.name.size() >= kA.size() && t.name.compare(t.name.size() - kA.size(), kA.size(), kA) == 0) {
      const float bound = 1.0f / std::sqrt(static_cast<float>(t.shape[1]));
      std::uniform_real_distribution<float> u(-bound, bound);
      for (size_t i = 0; i < n; ++i) p[i] = u(rng);
    } else {
      std::fill(p, p + n, 0.0f);
    }
  }
}

LoraView LoraView::of(const Lora& a, float* buf) {
  LoraView v;
  v.cfg = &a.cfg;
  v.scaling = a.cfg.scaling();
  v.layers = a.ptrs(buf ? buf : const_cast<float*>(a.params.data()));
  return v;
}

void lora_apply(const float* x, int rows, int in, int out, const LoraPair& p, int rank, float s, float* y,
                std::vector<float>& tmp) {
  if (rows <= 0) return;
  tmp.resize(static_cast<size_t>(rows) * rank);
  matmul_nt(x, p.A, tmp.data(), rows, rank, in, false);
  for (auto& v : tmp) v *= s;
  matmul_nt(tmp.data(), p.B, y, rows, out, rank, true);
}

void lora_backward(const float* x, const float* dy, int rows, int in, int out, const LoraPair& p, const LoraPair& grad,
                   int rank, float s, float* dx, std::vector<float>& tmp) {
  if (rows <= 0) return;
  const size_t n = static_cast<size_t>(rows) * rank;
  tmp.resize(2 * n);
  float* u = tmp.data();      // s·x·Aᵀ
  float* g = tmp.data() + n;  // s·dy·B
  matmul_nt(x, p.A, u, rows, rank, in, false);
  matmul_nn(dy, p.B, g, rows, rank, out, false);
  for (size_t i = 0; i < n; ++i) u[i] *= s, g[i] *= s;
  if (grad.B) matmul_tn(dy, u, grad.B, out, rank, rows, true);
  if (grad.A) matmul_tn(g, x, grad.A, rank, in, rows, true);
  if (dx) matmul_nn(g, p.A, dx, rows, in, rank, true);
}

Lora load_lora_dir(const LlamaConfig& base, const std::string& dir, std::string* weight_version) {
  const fs::path d(dir);
  const std::string cfg_path = (d / "adapter_config.json").string();
  if (!fs::exists(cfg_path)) throw std::runtime_error(cfg_path + ": not found (is '" + dir + "' a PEFT adapter directory?)");
  const JsonValue j = parse_json(read_text_file(cfg_path), cfg_path);
  if (j.kind != JsonValue::Object) throw std::runtime_error(cfg_path + ": not a JSON object");
  auto where = [&](const std::string& field) { return cfg_path + ": " + field; };
  auto truthy = [&](const char* k) {
    const JsonValue* v = j.get(k);
    return v && ((v->kind == JsonValue::Bool && v->b) || (v->kind == JsonValue::String && !v->str.empty()) ||
                 (v->kind == JsonValue::Array && !v->arr.empty()) || (v->kind == JsonValue::Object && !v->obj.empty()) ||
                 (v->kind == JsonValue::Number && v->num != 0));
  };
  if (const JsonValue* pt = j.get("peft_type"); pt && !(pt->kind == JsonValue::String && pt->str == "LORA"))
    throw std::runtime_error(where("peft_type") + " must be \"LORA\"" + (pt->kind == JsonValue::String ? ", got \"" + pt->str + "\"" : ""));
  LoraConfig c;
  const JsonValue* r = j.get("r");
  if (!r || r->kind != JsonValue::Number || r->num != std::floor(r->num) || r->num <= 0)
    throw std::runtime_error(where("r") + " must be a positive integer");
  c.rank = static_cast<int>(r->num);
  const JsonValue* al = j.get("lora_alpha");
  c.alpha = al && al->kind == JsonValue::Number ? static_cast<float>(al->num) : 8.0f;  // PEFT's default
  if (const JsonValue* rs = j.get("use_rslora"); rs && rs->kind == JsonValue::Bool) c.rslora = rs->b;
  const JsonValue* tm = j.get("target_modules");
  if (!tm || tm->kind != JsonValue::Array || tm->arr.empty())
    throw std::runtime_error(where("target_modules") +
                             " must be a non-empty list of module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj); a regex is not supported");
  c.targets = 0;
  for (auto& m : tm->arr) {
    const int t = m.kind == JsonValue::String ? lora_target_from_name(m.str) : -1;
    if (t < 0)
      throw std::runtime_error(where("target_modules") + ": '" + (m.kind == JsonValue::String ? m.str : "?") +
                               "' is not a Linear layer ooze adapts (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
    c.targets |= 1u << t;
  }
  for (const char* k : {"use_dora", "fan_in_fan_out", "modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern"})
    if (truthy(k)) throw std::runtime_error(where(k) + " is set; ooze implements plain LoRA only (unset it)");
  if (const JsonValue* b = j.get("bias"); b && !(b->kind == JsonValue::String && b->str == "none"))
    throw std::runtime_error(where("bias") + " must be \"none\" (adapters with trained biases are not supported)");
  const std::string err = c.validate();
  if (!err.empty()) throw std::runtime_error(cfg_path + ": " + err);
  Lora a = make_lora(base, c);
  const std::string st = (d / "adapter_model.safetensors").string();
  if (!fs::exists(st)) {
    if (fs::exists(d / "adapter_model.bin"))
      throw std::runtime_error((d / "adapter_model.bin").string() + ": pickle adapters are not read; save with safe_serialization=True");
    throw std::runtime_error(st + ": not found");
  }
  std::vector<bool> seen(a.tensors.size(), false);
  // PEFT may save the adapter name in the key (…q_proj.lora_A.default.weight) when asked to; ooze
  // reads the plain form PEFT writes by default.
  read_safetensors_into(st, a.tensors, a.params.data(), seen, weight_version, nullptr,
                        "a rank-" + std::to_string(c.rank) + " adapter of this base and these target_modules");
  for (size_t k = 0; k < seen.size(); ++k)
    if (!seen[k]) throw std::runtime_error(st + ": tensor '" + a.tensors[k].name + "' is missing (target_modules lists its module)");
  return a;
}

void save_lora_dir(const Lora& a, const std::string& dir, const std::string& base_model, const std::string& weight_version) {
  const fs::path d(dir);
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create directory: " + ec.message());
  write_safetensors((d / "adapter_model.safetensors").string(), a.tensors, a.params.data(), weight_version);
  std::string targets;
  for (int t = 0; t < kLoraTargets; ++t)
    if (a.cfg.has(t)) targets += std::string(targets.empty() ? "" : ", ") + json_quote(kTargetNames[t]);
  char alpha[32];
  std::snprintf(alpha, sizeof alpha, "%.9g", static_cast<double>(a.cfg.alpha));
  const std::string text = std::string("{\n") + "  \"peft_type\": \"LORA\",\n" + "  \"task_type\": \"CAUSAL_LM\",\n" +
                           "  \"base_model_name_or_path\": " + json_quote(base_model) + ",\n" +
                           "  \"r\": " + std::to_string(a.cfg.rank) + ",\n" + "  \"lora_alpha\": " + alpha + ",\n" +
                           "  \"target_modules\": [" + targets + "],\n" + "  \"lora_dropout\": 0.0,\n" +
                           "  \"bias\": \"none\",\n" + "  \"use_rslora\": " + (a.cfg.rslora ? "true" : "false") + ",\n" +
                           "  \"fan_in_fan_out\": false,\n" + "  \"inference_mode\": true\n}\n";
  write_text_atomic((d / "adapter_config.json").string(), text);
}

}  // namespace ooze
