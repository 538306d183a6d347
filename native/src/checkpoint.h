// Hugging Face checkpoint I/O for the Llama-architecture families: config.json and model.safetensors (F32, BF16 and
// F16 read; F32 written), plus the small JSON reader both formats need. Any native module may use it.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model.h"

namespace ooze {

/** A parsed JSON value (enough of JSON for config.json and safetensors headers). */
struct JsonValue {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<JsonValue> arr;
  std::vector<std::pair<std::string, JsonValue>> obj;  // in document order
  /** Member of an object, or nullptr. */
  const JsonValue* get(const std::string& key) const;
};

/** Parses `text`; throws std::runtime_error("<what>: ... at offset N") when malformed. */
JsonValue parse_json(const std::string& text, const std::string& what);

/** Escapes `s` as a JSON string literal (with quotes). */
std::string json_quote(const std::string& s);

/** Reads the LlamaConfig fields from a parsed config.json; `where` names the file in errors, and the field refused. */
LlamaConfig config_from_json(const JsonValue& j, const std::string& where);

/** config.json text for `cfg` (its family's architectures and model_type, float32). */
std::string config_to_json(const LlamaConfig& cfg);

/**
 * Reads every tensor of the safetensors file `path` into `params`, laid out as `tensors` (F32, BF16 or
 * F16 on disk; shapes must match), and sets seen[k] for each tensor k it read. A tensor the layout does
 * not name is skipped when `skip(name)` says so, else refused as "not part of `owner`". The metadata's
 * weight_version goes to `weight_version` when given. Throws std::runtime_error naming file and tensor.
 */
void read_safetensors_into(const std::string& path, const std::vector<TensorInfo>& tensors, float* params,
                           std::vector<bool>& seen, std::string* weight_version,
                           const std::function<bool(const std::string&)>& skip, const std::string& owner);

/** Writes `params` (laid out contiguously as `tensors`) to `path` as F32 safetensors, atomically. */
void write_safetensors(const std::string& path, const std::vector<TensorInfo>& tensors, const float* params,
                       const std::string& weight_version);

/** Writes `text` to `path` through a temporary file and a rename. */
void write_text_atomic(const std::string& path, const std::string& text);

/** The whole file at `path`; throws std::runtime_error naming it when it cannot be read. */
std::string read_text_file(const std::string& path);

/** What load_model_dir found besides the weights. */
struct LoadedInfo {
  std::string weight_version;  // from the safetensors __metadata__, "" when absent
};

/**
 * Loads `dir`/config.json and `dir`/model.safetensors (or the shards named by
 * model.safetensors.index.json). Accepts F32, BF16 and F16 tensors; a missing lm_head is fine when
 * tie_word_embeddings. Throws std::runtime_error naming the file and tensor on any problem.
 */
Model load_model_dir(const std::string& dir, LoadedInfo* info = nullptr);

/**
 * Writes `dir`/config.json and `dir`/model.safetensors (F32, tensors in layout order, header padded
 * with spaces to 8 bytes; `weight_version` goes into __metadata__ when non-empty). Each file is
 * written to a temporary name and renamed. Creates `dir` if needed.
 */
void save_model_dir(const Model& m, const std::string& dir, const std::string& weight_version);

}  // namespace ooze
