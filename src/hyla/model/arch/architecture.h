#pragma once
// The seam between the model and the files of one architecture. An architecture file
// (model/arch/<name>.cpp) holds everything that names one model of the class: the options it
// takes and their checks, its Hugging Face config keys and tensor names, its llama.cpp GGUF
// metadata keys and tensor table, and a short statement of its layer in SPEC's terms. The readers
// and writers of the formats (model/hf_checkpoint.h, model/gguf_model.h) are generic: they run the
// tables an architecture gives them. Model code never asks for an architecture's name, only for
// the options of ModelConfig.
//
// What crosses the seam:
//   ModelConfig      → check (the options this architecture may take), the GGUF key writer, the
//                      tensor tables
//   a config.json    → config_from_hf (a ModelConfig with `architecture` set)
//   a tensor name    → hf_tensor (hyla's name, and a reshape of the same values)
//   a GGUF's keys    → read_gguf (a ModelConfig with `architecture` set)
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/io/gguf.h"
#include "hyla/model/config.h"

namespace hyla {

// A rule an architecture imposes on the options: require(ok, what) fails naming `what`.
using Requirement = std::function<void(bool ok, std::string_view what)>;

// A Hugging Face checkpoint tensor in hyla's terms (SPEC §8 names).
struct HfTensor {
  std::string name;
  std::optional<Shape> shape;  // a reshape of the same values
  bool first_values = false;   // only the first shape->numel() values (Kimi's A_log [1, 1, H, 1] or longer)
};

// How a GGUF tensor holds hyla's parameters: the transforms llama.cpp's converters apply.
enum class GgufLink {
  Same,     // one parameter, same values and layout (GGUF `ne` is hyla's shape reversed)
  NegExp,   // ssm_a = −exp(A_log)
  Exp,      // ssm_a = exp(A_log)
  Experts,  // ffn_*_exps: the E experts' matrices stacked, expert slowest
  KeyB,     // attn_k_b [H, c, Dn] = kv_b_proj's key rows per head, transposed
  ValueB,   // attn_v_b [H, Dv, c] = kv_b_proj's value rows per head (read with its KeyB)
  Score,    // *_res_score = *_res_query ⊙ *_res_norm.weight
};

struct GgufTensorMap {
  std::string gguf;
  std::vector<int64_t> ne;        // as written (fastest first)
  GgufLink link = GgufLink::Same;
  std::vector<std::string> hyla;  // the parameters it holds (Experts: one per expert; Score: query, norm)
  bool matrix = false;            // a matrix-product weight: stored in the export's matrix type
};

// One GGUF's metadata keys of an architecture, "<gguf_arch>.<name>", read with the file named in errors.
class GgufKeys {
 public:
  GgufKeys(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}
  const GgufFile& file() const { return file_; }
  std::string source() const { return file_.path().string(); }
  std::string key(std::string_view name) const { return arch_ + "." + std::string(name); }
  bool has(std::string_view name) const { return file_.has(key(name)); }
  int64_t integer(std::string_view name) const { return file_.integer(key(name)); }
  int64_t integer_or(std::string_view name, int64_t otherwise) const { return has(name) ? integer(name) : otherwise; }
  double number(std::string_view name) const { return file_.number(key(name)); }
  bool boolean(std::string_view name) const { return file_.boolean(key(name)); }
  std::vector<int64_t> integers(std::string_view name) const { return file_.integers(key(name)); }
  std::vector<double> numbers(std::string_view name) const { return file_.numbers(key(name)); }
  int64_t uniform(std::string_view name) const;  // a per-layer array whose values all agree (or a scalar)

 private:
  const GgufFile& file_;
  std::string arch_;
};

// The same keys written.
class GgufKeyWriter {
 public:
  GgufKeyWriter(GgufMetadata& metadata, std::string arch) : metadata_(metadata), arch_(std::move(arch)) {}
  void u32(std::string_view name, int64_t value);
  void f32(std::string_view name, double value);
  void boolean(std::string_view name, bool value);
  void u32_array(std::string_view name, const std::vector<int64_t>& values);
  void f32_array(std::string_view name, const std::vector<double>& values);

 private:
  GgufMetadata& metadata_;
  std::string arch_;
};

struct Architecture {
  std::string_view name;     // config.json's "architecture"
  std::string_view summary;  // its layer in SPEC's terms
  // The options a model of this architecture takes; every rule broken is named.
  void (*check)(const ModelConfig& config, const Requirement& require) = nullptr;

  // A Hugging Face checkpoint: its config.json's model_type ("" for none) or the model class its
  // `architectures` names first (as llama.cpp's converter picks one; "" for none), the ModelConfig of that
  // config.json (files beside it, e.g. preprocessor_config.json, are read from its directory), and
  // each tensor's hyla name (nullopt: a tensor hyla skips; an error for one it does not know).
  std::string_view hf_model_type;
  std::string_view hf_class;
  ModelConfig (*config_from_hf)(const nlohmann::json& config_json, const std::string& config_path) = nullptr;
  std::optional<HfTensor> (*hf_tensor)(const std::string& name, const ModelConfig& config,
                                       const std::string& source) = nullptr;

  // A llama.cpp GGUF: general.architecture ("" for none), its metadata both ways, its tensor table.
  std::string_view gguf_arch;
  ModelConfig (*read_gguf)(const GgufKeys& keys) = nullptr;
  void (*write_gguf)(const ModelConfig& config, GgufKeyWriter& keys) = nullptr;
  std::vector<GgufTensorMap> (*gguf_tensors)(const ModelConfig& config) = nullptr;
  // Tensors of a file the model does not read (e.g. multi-token-prediction layers); nullptr: none.
  bool (*gguf_skips)(const ModelConfig& config, std::string_view tensor) = nullptr;
};

// Every architecture hyla implements, in a fixed order (hyla's own first).
std::span<const Architecture* const> architectures();
// By config.json's "architecture" name; an error listing the known ones.
const Architecture& architecture(std::string_view name);
// By a checkpoint config.json's model_type or its first `architectures` class, or a GGUF's
// general.architecture; nullptr when none has it.
const Architecture* architecture_of_hf(const nlohmann::json& config_json);
const Architecture* architecture_of_gguf(std::string_view gguf_arch);

// `config`'s options against its architecture's rules: an error naming the architecture, the rule
// and `source`.
void check_architecture(const ModelConfig& config, const std::string& source);

}  // namespace hyla
