// Hugging Face checkpoint I/O (see checkpoint.h): a small JSON reader, config.json fields of the
// Llama-architecture families (llama, mistral, qwen2, qwen3), safetensors read (F32/BF16/F16) and write (F32), atomic file replacement.
// The JS exports are in checkpoint_napi.cc.
#include "checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <unistd.h>


namespace fs = std::filesystem;

namespace ooze {

// ---------------------------------------------------------------- JSON

const JsonValue* JsonValue::get(const std::string& key) const {
  if (kind != Object) return nullptr;
  for (auto& [k, v] : obj)
    if (k == key) return &v;
  return nullptr;
}

namespace {

struct JsonParser {
  const std::string& s;
  const std::string& what;
  size_t i = 0;
  int depth = 0;

  [[noreturn]] void fail(const std::string& msg) {
    throw std::runtime_error(what + ": malformed JSON: " + msg + " at offset " + std::to_string(i));
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  void expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c) fail(std::string("expected '") + c + "'");
    ++i;
  }
  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex4() {
    if (i + 4 > s.size()) fail("short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s[i++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else fail("bad \\u escape");
    }
    return v;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (i >= s.size()) fail("unterminated string");
      char c = s[i++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) fail("unterminated escape");
      char e = s[i++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= s.size() && s[i] == '\\' && s[i + 1] == 'u') {
            i += 2;
            uint32_t lo = hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
  JsonValue value() {
    if (++depth > 64) fail("nested too deeply");
    ws();
    if (i >= s.size()) fail("unexpected end");
    JsonValue v;
    char c = s[i];
    if (c == '{') {
      v.kind = JsonValue::Object;
      ++i;
      ws();
      if (i < s.size() && s[i] == '}') {
        ++i;
      } else {
        while (true) {
          ws();
          std::string k = string();
          expect(':');
          v.obj.emplace_back(std::move(k), value());
          ws();
          if (i < s.size() && s[i] == ',') { ++i; continue; }
          expect('}');
          break;
        }
      }
    } else if (c == '[') {
      v.kind = JsonValue::Array;
      ++i;
      ws();
      if (i < s.size() && s[i] == ']') {
        ++i;
      } else {
        while (true) {
          v.arr.push_back(value());
          ws();
          if (i < s.size() && s[i] == ',') { ++i; continue; }
          expect(']');
          break;
        }
      }
    } else if (c == '"') {
      v.kind = JsonValue::String;
      v.str = string();
    } else if (s.compare(i, 4, "true") == 0) {
      v.kind = JsonValue::Bool, v.b = true, i += 4;
    } else if (s.compare(i, 5, "false") == 0) {
      v.kind = JsonValue::Bool, v.b = false, i += 5;
    } else if (s.compare(i, 4, "null") == 0) {
      i += 4;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = i;
      while (i < s.size() && (std::strchr("+-.eE", s[i]) || (s[i] >= '0' && s[i] <= '9'))) ++i;
      std::string t = s.substr(start, i - start);
      char* end = nullptr;
      v.kind = JsonValue::Number;
      v.num = std::strtod(t.c_str(), &end);
      if (end != t.c_str() + t.size()) fail("bad number '" + t + "'");
    } else if (s.compare(i, 8, "Infinity") == 0 || s.compare(i, 3, "NaN") == 0) {
      fail("non-finite number");
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    --depth;
    return v;
  }
};

}  // namespace

JsonValue parse_json(const std::string& text, const std::string& what) {
  JsonParser p{text, what};
  JsonValue v = p.value();
  p.ws();
  if (p.i != text.size()) p.fail("trailing characters");
  return v;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  return out + "\"";
}

// ---------------------------------------------------------------- config.json

/**
 * A rope scaling object (`rope_scaling` or `rope_parameters`); `where` names it in errors.
 * `default_original` stands in for a missing original_max_position_embeddings (yarn, as transformers
 * does: the top-level field, else max_position_embeddings).
 */
static RopeScaling rope_from_json(const JsonValue& r, const std::string& where, int default_original,
                                  int max_position_embeddings) {
  if (r.kind != JsonValue::Object) throw std::runtime_error(where + " must be an object or null");
  const JsonValue* type = r.get("rope_type");
  if (!type || type->kind == JsonValue::Null) type = r.get("type");  // transformers < 4.45
  const std::string name = type && type->kind == JsonValue::String ? type->str : "default";
  auto present = [&](const char* key) {
    const JsonValue* v = r.get(key);
    return v && v->kind != JsonValue::Null;
  };
  auto number = [&](const char* key, bool required, double def) {
    const JsonValue* v = r.get(key);
    if (!v || v->kind == JsonValue::Null) {
      if (required) throw std::runtime_error(where + "." + key + " is required for rope_type '" + name + "'");
      return def;
    }
    if (v->kind != JsonValue::Number) throw std::runtime_error(where + "." + key + " must be a number");
    return v->num;
  };
  auto original = [&](bool required) {
    const double orig = number("original_max_position_embeddings", required, default_original);
    if (orig != std::floor(orig) || orig <= 0 || orig > 2e9)
      throw std::runtime_error(where + ".original_max_position_embeddings must be a positive integer");
    return static_cast<int>(orig);
  };
  if (present("partial_rotary_factor") && number("partial_rotary_factor", false, 1.0) != 1.0)
    throw std::runtime_error(where + ".partial_rotary_factor other than 1 is not supported");
  RopeScaling out;
  if (name == "default") return out;
  if (name == "linear") {
    out.type = RopeType::Linear;
    out.factor = static_cast<float>(number("factor", true, 1.0));
  } else if (name == "llama3") {
    out.type = RopeType::Llama3;
    out.factor = static_cast<float>(number("factor", true, 1.0));
    out.low_freq_factor = static_cast<float>(number("low_freq_factor", true, 1.0));
    out.high_freq_factor = static_cast<float>(number("high_freq_factor", true, 4.0));
    out.original_max_position_embeddings = original(true);
  } else if (name == "yarn") {
    out.type = RopeType::Yarn;
    out.original_max_position_embeddings = original(false);
    out.factor = static_cast<float>(
        number("factor", false, static_cast<double>(max_position_embeddings) / out.original_max_position_embeddings));
    // transformers treats 0 and null alike for these (`x or default`).
    out.beta_fast = present("beta_fast") && number("beta_fast", false, 0) != 0 ? static_cast<float>(number("beta_fast", false, 0)) : 32.0f;
    out.beta_slow = present("beta_slow") && number("beta_slow", false, 0) != 0 ? static_cast<float>(number("beta_slow", false, 0)) : 1.0f;
    out.mscale = static_cast<float>(number("mscale", false, 0.0));
    out.mscale_all_dim = static_cast<float>(number("mscale_all_dim", false, 0.0));
    out.attention_factor = static_cast<float>(number("attention_factor", false, 0.0));
    if (out.attention_factor < 0) throw std::runtime_error(where + ".attention_factor must be > 0");
    if (const JsonValue* t = r.get("truncate"); t && t->kind != JsonValue::Null) {
      if (t->kind != JsonValue::Bool) throw std::runtime_error(where + ".truncate must be a boolean");
      out.truncate = t->b;
    }
  } else {
    throw std::runtime_error(where + ".rope_type '" + name + "' is not supported (default, linear, llama3, yarn)");
  }
  return out;
}

/** The family from `model_type`, else from `architectures[0]`; neither: llama. */
static Family family_from_json(const JsonValue& j, const std::string& where) {
  std::string type;
  if (const JsonValue* t = j.get("model_type"); t && t->kind == JsonValue::String) {
    type = t->str;
  } else if (const JsonValue* a = j.get("architectures"); a && a->kind == JsonValue::Array && !a->arr.empty() &&
                                                          a->arr[0].kind == JsonValue::String) {
    const std::string& arch = a->arr[0].str;
    type = arch == "LlamaForCausalLM" ? "llama" : arch == "MistralForCausalLM" ? "mistral"
         : arch == "Qwen2ForCausalLM" ? "qwen2" : arch == "Qwen3ForCausalLM" ? "qwen3" : "architectures[0] " + arch;
  }
  if (type.empty() || type == "llama") return Family::Llama;
  if (type == "mistral") return Family::Mistral;
  if (type == "qwen2") return Family::Qwen2;
  if (type == "qwen3") return Family::Qwen3;
  throw std::runtime_error(where + ": model_type '" + type + "' is not supported (llama, mistral, qwen2, qwen3)");
}

LlamaConfig config_from_json(const JsonValue& j, const std::string& where) {
  if (j.kind != JsonValue::Object) throw std::runtime_error(where + ": config must be a JSON object");
  auto num = [&](const char* key, bool required, double def) -> double {
    const JsonValue* v = j.get(key);
    if (!v || v->kind == JsonValue::Null) {
      if (required) throw std::runtime_error(where + ": missing field '" + key + "'");
      return def;
    }
    if (v->kind == JsonValue::Array && !v->arr.empty() && v->arr[0].kind == JsonValue::Number)
      return v->arr[0].num;  // e.g. eos_token_id: [a, b] — the first is the model's EOS
    if (v->kind != JsonValue::Number) throw std::runtime_error(where + ": field '" + key + "' must be a number");
    return v->num;
  };
  auto integer = [&](const char* key, bool required, int def) -> int {
    double d = num(key, required, def);
    if (d != std::floor(d) || std::fabs(d) > 2e9)
      throw std::runtime_error(where + ": field '" + key + "' must be an integer");
    return static_cast<int>(d);
  };
  auto flag = [&](const char* key) {
    const JsonValue* b = j.get(key);
    if (!b || b->kind == JsonValue::Null) return false;
    if (b->kind != JsonValue::Bool) throw std::runtime_error(where + ": field '" + key + "' must be a boolean");
    return b->b;
  };
  LlamaConfig c;
  c.family = family_from_json(j, where);
  c.vocab_size = integer("vocab_size", true, 0);
  c.hidden_size = integer("hidden_size", true, 0);
  c.intermediate_size = integer("intermediate_size", true, 0);
  c.num_hidden_layers = integer("num_hidden_layers", true, 0);
  c.num_attention_heads = integer("num_attention_heads", true, 0);
  c.num_key_value_heads = integer("num_key_value_heads", false, c.num_attention_heads);
  c.head_dim_explicit = integer("head_dim", false, 0);
  c.rms_norm_eps = static_cast<float>(num("rms_norm_eps", false, 1e-6));
  c.rope_theta = static_cast<float>(num("rope_theta", false, 10000.0));
  c.max_position_embeddings = integer("max_position_embeddings", false, 2048);
  c.bos_token_id = integer("bos_token_id", false, 1);
  c.eos_token_id = integer("eos_token_id", false, 2);
  c.tie_word_embeddings = flag("tie_word_embeddings");
  // Refuse what this implementation would compute differently from HF, rather than be silently wrong.
  if (const JsonValue* a = j.get("hidden_act"); a && a->kind == JsonValue::String && a->str != "silu")
    throw std::runtime_error(where + ": hidden_act '" + a->str + "' is not supported (only silu)");
  if (flag("mlp_bias")) throw std::runtime_error(where + ": mlp_bias = true is not supported");
  if (j.get("partial_rotary_factor") && num("partial_rotary_factor", false, 1.0) != 1.0)
    throw std::runtime_error(where + ": partial_rotary_factor other than 1 is not supported");
  switch (c.family) {
    case Family::Llama:
    case Family::Qwen3:
      c.qkv_bias = c.o_bias = flag("attention_bias");
      c.qk_norm = c.family == Family::Qwen3;
      break;
    case Family::Mistral:
      if (flag("attention_bias")) throw std::runtime_error(where + ": attention_bias = true is not supported for mistral");
      c.sliding_window = integer("sliding_window", false, 0);
      if (c.sliding_window <= 0 && j.get("sliding_window") && j.get("sliding_window")->kind != JsonValue::Null)
        throw std::runtime_error(where + ": sliding_window must be a positive integer or null");
      break;
    case Family::Qwen2:
      c.qkv_bias = true;  // Qwen2's q/k/v projections always have biases, o_proj never
      break;
  }
  if (c.family == Family::Qwen2 || c.family == Family::Qwen3) {
    // Sliding-window layers (use_sliding_window, or a layer_types entry other than full attention).
    if (flag("use_sliding_window")) throw std::runtime_error(where + ": use_sliding_window = true is not supported");
    if (const JsonValue* lt = j.get("layer_types"); lt && lt->kind == JsonValue::Array)
      for (size_t i = 0; i < lt->arr.size(); ++i)
        if (lt->arr[i].kind != JsonValue::String || lt->arr[i].str != "full_attention")
          throw std::runtime_error(where + ": layer_types[" + std::to_string(i) + "] '" +
                                   (lt->arr[i].kind == JsonValue::String ? lt->arr[i].str : std::string("?")) +
                                   "' is not supported (only full_attention)");
  }
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"})
    if (j.get(key) && num(key, false, 0) > 0) throw std::runtime_error(where + ": " + key + " > 0 (mixture of experts) is not supported");
  // Rotary scaling as transformers 4.x wrote it (`rope_scaling`: null or {rope_type | type, factor, …},
  // with `rope_theta` beside it) and as transformers 5 writes it (`rope_parameters`: {rope_theta,
  // rope_type, factor, …}); when both are there, rope_parameters wins.
  const int default_original = integer("original_max_position_embeddings", false, c.max_position_embeddings);
  if (const JsonValue* r = j.get("rope_scaling"); r && r->kind != JsonValue::Null)
    c.rope_scaling = rope_from_json(*r, where + ": rope_scaling", default_original, c.max_position_embeddings);
  if (const JsonValue* rp = j.get("rope_parameters"); rp && rp->kind != JsonValue::Null) {
    c.rope_scaling = rope_from_json(*rp, where + ": rope_parameters", default_original, c.max_position_embeddings);
    if (const JsonValue* th = rp->get("rope_theta"); th && th->kind == JsonValue::Number)
      c.rope_theta = static_cast<float>(th->num);
  }
  std::string err = c.validate();
  if (!err.empty()) throw std::runtime_error(where + ": invalid config: " + err);
  return c;
}

static std::string fmt_float(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

/** `rope_parameters` (with rope_theta) or `rope_scaling` (null when there is no scaling) as JSON. */
static std::string rope_to_json(const LlamaConfig& c, bool parameters) {
  const RopeScaling& r = c.rope_scaling;
  if (!parameters && r.type == RopeType::Default) return "null";
  std::ostringstream o;
  o << "{";
  if (parameters) o << "\"rope_theta\": " << fmt_float(c.rope_theta) << ", ";
  switch (r.type) {
    case RopeType::Default: o << "\"rope_type\": \"default\""; break;
    case RopeType::Linear: o << "\"rope_type\": \"linear\", \"factor\": " << fmt_float(r.factor); break;
    case RopeType::Llama3:
      o << "\"rope_type\": \"llama3\", \"factor\": " << fmt_float(r.factor) << ", \"low_freq_factor\": " << fmt_float(r.low_freq_factor)
        << ", \"high_freq_factor\": " << fmt_float(r.high_freq_factor)
        << ", \"original_max_position_embeddings\": " << r.original_max_position_embeddings;
      break;
    case RopeType::Yarn:
      o << "\"rope_type\": \"yarn\", \"factor\": " << fmt_float(r.factor)
        << ", \"original_max_position_embeddings\": " << r.original_max_position_embeddings
        << ", \"beta_fast\": " << fmt_float(r.beta_fast) << ", \"beta_slow\": " << fmt_float(r.beta_slow);
      if (r.mscale != 0.0f) o << ", \"mscale\": " << fmt_float(r.mscale);
      if (r.mscale_all_dim != 0.0f) o << ", \"mscale_all_dim\": " << fmt_float(r.mscale_all_dim);
      if (r.attention_factor > 0.0f) o << ", \"attention_factor\": " << fmt_float(r.attention_factor);
      if (!r.truncate) o << ", \"truncate\": false";
      break;
  }
  o << "}";
  return o.str();
}

std::string config_to_json(const LlamaConfig& c) {
  const char* type = model_type_name(c.family);
  const char* arch = c.family == Family::Mistral ? "MistralForCausalLM"
                   : c.family == Family::Qwen2   ? "Qwen2ForCausalLM"
                   : c.family == Family::Qwen3   ? "Qwen3ForCausalLM"
                                                 : "LlamaForCausalLM";
  std::ostringstream o;
  o << "{\n"
    << "  \"architectures\": [\"" << arch << "\"],\n"
    << "  \"model_type\": \"" << type << "\",\n"
    << "  \"torch_dtype\": \"float32\",\n"
    << "  \"hidden_act\": \"silu\",\n"
    << "  \"vocab_size\": " << c.vocab_size << ",\n"
    << "  \"hidden_size\": " << c.hidden_size << ",\n"
    << "  \"intermediate_size\": " << c.intermediate_size << ",\n"
    << "  \"num_hidden_layers\": " << c.num_hidden_layers << ",\n"
    << "  \"num_attention_heads\": " << c.num_attention_heads << ",\n"
    << "  \"num_key_value_heads\": " << c.num_key_value_heads << ",\n"
    << "  \"head_dim\": " << c.head_dim() << ",\n"
    << "  \"rms_norm_eps\": " << fmt_float(c.rms_norm_eps) << ",\n"
    << "  \"rope_theta\": " << fmt_float(c.rope_theta) << ",\n"
    << "  \"rope_scaling\": " << rope_to_json(c, false) << ",\n"
    << "  \"rope_parameters\": " << rope_to_json(c, true) << ",\n";
  if (c.family == Family::Llama || c.family == Family::Qwen3 || c.family == Family::Mistral)
    o << "  \"attention_bias\": " << (c.o_bias ? "true" : "false") << ",\n";
  if (c.family == Family::Llama) o << "  \"mlp_bias\": false,\n";
  if (c.family == Family::Mistral) {
    o << "  \"sliding_window\": ";
    if (c.sliding_window > 0) o << c.sliding_window; else o << "null";
    o << ",\n";
  }
  if (c.family == Family::Qwen2 || c.family == Family::Qwen3)
    o << "  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n  \"max_window_layers\": " << c.num_hidden_layers << ",\n";
  o << "  \"attention_dropout\": 0.0,\n"
    << "  \"max_position_embeddings\": " << c.max_position_embeddings << ",\n"
    << "  \"initializer_range\": 0.02,\n"
    << "  \"tie_word_embeddings\": " << (c.tie_word_embeddings ? "true" : "false") << ",\n"
    << "  \"bos_token_id\": " << c.bos_token_id << ",\n"
    << "  \"eos_token_id\": " << c.eos_token_id << ",\n"
    << "  \"use_cache\": true\n"
    << "}\n";
  return o.str();
}

// ---------------------------------------------------------------- safetensors

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error(p.string() + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

}  // namespace

void read_safetensors_into(const std::string& file, const std::vector<TensorInfo>& tensors, float* params,
                           std::vector<bool>& seen, std::string* weight_version,
                           const std::function<bool(const std::string&)>& skip, const std::string& owner) {
  const fs::path path(file);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(file + ": cannot open");
  f.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  if (size < 8) throw std::runtime_error(file + ": truncated (" + std::to_string(size) + " bytes, no header length)");
  unsigned char lenb[8];
  f.read(reinterpret_cast<char*>(lenb), 8);
  uint64_t hlen = 0;
  for (int k = 7; k >= 0; --k) hlen = (hlen << 8) | lenb[k];
  if (hlen == 0 || hlen > 100'000'000 || hlen > size - 8)
    throw std::runtime_error(file + ": bad safetensors header length " + std::to_string(hlen) + " (file is " +
                             std::to_string(size) + " bytes)");
  std::string header(hlen, '\0');
  f.read(header.data(), static_cast<std::streamsize>(hlen));
  if (!f) throw std::runtime_error(file + ": truncated header");
  JsonValue h = parse_json(header, file + " (safetensors header)");
  if (h.kind != JsonValue::Object) throw std::runtime_error(file + ": safetensors header is not a JSON object");
  const uint64_t data_start = 8 + hlen, data_size = size - data_start;
  std::unordered_map<std::string, size_t> index;
  for (size_t k = 0; k < tensors.size(); ++k) index.emplace(tensors[k].name, k);
  std::vector<unsigned char> buf;
  for (auto& [name, t] : h.obj) {
    if (name == "__metadata__") {
      if (weight_version && t.kind == JsonValue::Object)
        if (const JsonValue* wv = t.get("weight_version"); wv && wv->kind == JsonValue::String)
          *weight_version = wv->str;
      continue;
    }
    const std::string where = file + ": tensor '" + name + "'";
    const auto found = index.find(name);
    if (found == index.end()) {
      if (skip && skip(name)) continue;
      throw std::runtime_error(where + " is not part of " + owner);
    }
    const TensorInfo* ti = &tensors[found->second];
    const JsonValue* dt = t.get("dtype");
    const JsonValue* shape = t.get("shape");
    const JsonValue* offs = t.get("data_offsets");
    if (!dt || dt->kind != JsonValue::String || !shape || shape->kind != JsonValue::Array || !offs ||
        offs->kind != JsonValue::Array || offs->arr.size() != 2)
      throw std::runtime_error(where + ": entry needs dtype, shape and data_offsets [begin, end]");
    std::vector<int64_t> shp;
    for (auto& d : shape->arr) shp.push_back(static_cast<int64_t>(d.num));
    if (shp != ti->shape) {
      std::string a, b;
      for (auto d : shp) a += (a.empty() ? "" : ", ") + std::to_string(d);
      for (auto d : ti->shape) b += (b.empty() ? "" : ", ") + std::to_string(d);
      throw std::runtime_error(where + ": shape [" + a + "] but the config needs [" + b + "]");
    }
    size_t esize;
    if (dt->str == "F32") esize = 4;
    else if (dt->str == "BF16" || dt->str == "F16") esize = 2;
    else throw std::runtime_error(where + ": dtype " + dt->str + " is not supported (F32, BF16, F16)");
    const double b0 = offs->arr[0].num, b1 = offs->arr[1].num;
    const uint64_t nbytes = ti->numel() * esize;
    if (b0 < 0 || b1 < b0 || b1 > static_cast<double>(data_size) || static_cast<uint64_t>(b1 - b0) != nbytes)
      throw std::runtime_error(where + ": data_offsets [" + std::to_string((long long)b0) + ", " +
                               std::to_string((long long)b1) + "] do not fit " + std::to_string(nbytes) +
                               " bytes inside the " + std::to_string(data_size) + "-byte data section (truncated file?)");
    buf.resize(nbytes);
    f.seekg(static_cast<std::streamoff>(data_start + static_cast<uint64_t>(b0)));
    f.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(nbytes));
    if (!f) throw std::runtime_error(where + ": read failed");
    float* dst = params + ti->offset;
    const size_t n = ti->numel();
    if (esize == 4) {
      std::memcpy(dst, buf.data(), nbytes);
    } else {
      const bool bf = dt->str == "BF16";
      for (size_t k = 0; k < n; ++k) {
        uint16_t v = static_cast<uint16_t>(buf[2 * k] | (buf[2 * k + 1] << 8));
        dst[k] = bf ? bf16_to_f32(v) : f16_to_f32(v);
      }
    }
    seen[found->second] = true;
  }
}

namespace {

/** Writes `bytes` to `path` via a temporary file in the same directory and a rename. */
void write_atomic(const fs::path& path, const std::string& head, const float* data, size_t nfloats) {
  fs::path tmp = path;
  tmp += ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error(tmp.string() + ": cannot create");
    f.write(head.data(), static_cast<std::streamsize>(head.size()));
    if (data) f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(nfloats * 4));
    f.flush();
    if (!f) throw std::runtime_error(tmp.string() + ": write failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(path.string() + ": rename failed: " + ec.message());
}

}  // namespace

Model load_model_dir(const std::string& dir, LoadedInfo* info) {
  const fs::path d(dir);
  const fs::path cfg_path = d / "config.json";
  if (!fs::exists(cfg_path)) throw std::runtime_error(cfg_path.string() + ": not found (is '" + dir + "' a model directory?)");
  LlamaConfig cfg = config_from_json(parse_json(read_text(cfg_path), cfg_path.string()), cfg_path.string());
  Model m = make_model(cfg);
  std::vector<bool> seen(m.tensors.size(), false);
  std::vector<fs::path> files;
  const fs::path single = d / "model.safetensors", index = d / "model.safetensors.index.json";
  if (fs::exists(single)) {
    files.push_back(single);
  } else if (fs::exists(index)) {
    JsonValue ix = parse_json(read_text(index), index.string());
    const JsonValue* wm = ix.get("weight_map");
    if (!wm || wm->kind != JsonValue::Object) throw std::runtime_error(index.string() + ": no weight_map object");
    for (auto& [name, file] : wm->obj) {
      fs::path p = d / file.str;
      bool dup = false;
      for (auto& q : files) dup = dup || q == p;
      if (!dup) files.push_back(p);
    }
  } else {
    throw std::runtime_error(single.string() + ": not found (nor model.safetensors.index.json)");
  }
  const Family fam = m.cfg.family;
  const bool tied = m.cfg.tie_word_embeddings;
  auto skip = [tied](const std::string& name) {
    return name.find("rotary_emb.inv_freq") != std::string::npos ||  // old HF checkpoints
           (name == "lm_head.weight" && tied);                         // a saved tied copy
  };
  const std::string owner = std::string("a ") + model_type_name(fam) + " model with this config";
  for (auto& p : files)
    read_safetensors_into(p.string(), m.tensors, m.params.data(), seen, info ? &info->weight_version : nullptr, skip, owner);
  for (size_t k = 0; k < seen.size(); ++k)
    if (!seen[k])
      throw std::runtime_error((files.size() == 1 ? files[0].string() : dir) + ": tensor '" + m.tensors[k].name +
                               "' is missing");
  return m;
}

void write_safetensors(const std::string& path, const std::vector<TensorInfo>& tensors, const float* params,
                       const std::string& weight_version) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"";
  if (!weight_version.empty()) h += ",\"weight_version\":" + json_quote(weight_version);
  h += "}";
  size_t off = 0, floats = 0;
  for (auto& t : tensors) {
    if (t.offset != floats) throw std::logic_error("write_safetensors: tensors must be contiguous in layout order");
    h += "," + json_quote(t.name) + ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t k = 0; k < t.shape.size(); ++k) h += (k ? "," : "") + std::to_string(t.shape[k]);
    size_t bytes = t.numel() * 4;
    h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + bytes) + "]}";
    off += bytes, floats += t.numel();
  }
  h += "}";
  while (h.size() % 8) h += ' ';
  std::string head(8, '\0');
  uint64_t n = h.size();
  for (int k = 0; k < 8; ++k) head[k] = static_cast<char>((n >> (8 * k)) & 0xFF);
  head += h;
  // Tensors are contiguous in layout order, so the data section is the buffer itself.
  write_atomic(path, head, params, floats);
}

void write_text_atomic(const std::string& path, const std::string& text) { write_atomic(path, text, nullptr, 0); }

std::string read_text_file(const std::string& path) { return read_text(path); }

void save_model_dir(const Model& m, const std::string& dir, const std::string& weight_version) {
  const fs::path d(dir);
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create directory: " + ec.message());
  write_safetensors((d / "model.safetensors").string(), m.tensors, m.params.data(), weight_version);
  write_atomic(d / "config.json", config_to_json(m.cfg), nullptr, 0);
}

}  // namespace ooze
