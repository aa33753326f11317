// `hyla convert`: a hyla model directory or a Hugging Face checkpoint to a llama.cpp GGUF file of
// the model's architecture (model/arch/architecture.h), its MoonViT tower to an mmproj file beside
// it, and any of them (a GGUF with its mmproj) to a hyla model directory, one tensor at a time
// (model/model_files.h).
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "commands.h"
#include "hyla/core/byte_size.h"
#include "hyla/data/gguf_vocab.h"
#include "hyla/io/file.h"
#include "hyla/io/gguf.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/arch/architecture.h"
#include "hyla/model/gguf_model.h"
#include "hyla/model/model_files.h"
#include "hyla/model/moonvit_gguf.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/model/weight_values.h"

namespace hyla::cli {
namespace fs = std::filesystem;

void add_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Convert between hyla model directories, llama.cpp GGUF files and Hugging Face checkpoints");
  static std::string in, out, to, from, type = "bf16", weight_dtype = "f32", split_max_size, architecture_name;
  static bool force = false;
  static std::filesystem::path mmproj, mmproj_out;
  cmd->add_option("-m,--model", in, "Model directory, GGUF file, or Hugging Face checkpoint")->required();
  cmd->add_option("--out", out, "Output GGUF file (--to gguf) or model directory (--to hyla)")->required();
  cmd->add_option("--to", to, "Output format (default: the other one)")->check(CLI::IsMember({"gguf", "hyla"}));
  cmd->add_option("--from", from, "Input format, checked (default: detected)")->check(CLI::IsMember({"gguf", "hyla", "hf"}));
  cmd->add_option("--type", type, "GGUF matrix type: f32, f16, bf16 or q8_0 (norms, biases, convs, router: f32)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  cmd->add_option("--weight-dtype", weight_dtype, "Model directory weights: f32, bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--split-max-size", split_max_size,
                  "Write the GGUF as a split set (OUT-00001-of-0000N.gguf, as llama-gguf-split): the first shard the "
                  "metadata, each other at most this many tensor bytes (e.g. 4G; binary units)");
  cmd->add_option("--architecture", architecture_name,
                  "The architecture the output names (kimi_k3, kimi_linear, hyla): a model of hyla's own whose options "
                  "keep that architecture's rules becomes one of it (default: the model's)");
  add_mmproj_option(cmd, mmproj);
  cmd->add_option("--mmproj-out", mmproj_out,
                  "With --to gguf: write the model's MoonViT tower as a llama.cpp mmproj file (kimik25) too");
  cmd->add_flag("--force", force, "Replace --out even if it is not an earlier output of this command");
  cmd->callback([] {
    const ModelFiles files = open_model_files(in, {.mmproj = mmproj});
    const bool gguf_in = files.format == ModelFiles::Format::Gguf;
    const std::string detected = gguf_in ? "gguf" : files.format == ModelFiles::Format::HuggingFace ? "hf" : "hyla";
    HYLA_CHECK(from.empty() || from == detected, "convert: --from {} but {} is {}", from, in,
               detected == "gguf" ? "a GGUF file" : detected == "hf" ? "a Hugging Face checkpoint" : "a hyla model directory");
    const std::string target = to.empty() ? (gguf_in ? "hyla" : "gguf") : to;
    ModelConfig config = files.config;
    if (!architecture_name.empty()) {
      config.architecture = architecture(architecture_name).name;
      check_architecture(config, in + " (--architecture " + architecture_name + ")");
    }
    const ModelWeights& weights = *files.weights;
    const std::optional<Tokenizer> tokenizer = find_model_tokenizer(in);
    for (const std::string& name : weights.names()) check_weight_values(weights, name);  // what the loaders refuse
    if (target == "gguf") {
      HYLA_CHECK(force || !fs::exists(out) || is_gguf_file(out),
                 "convert: {} exists and is not a GGUF file; give --force to replace it", out);
      GgufExportOptions options{.matrices = ggml_type_from_name(type)};
      if (!split_max_size.empty()) {
        const std::optional<int64_t> bytes = parse_byte_size(split_max_size);
        HYLA_CHECK(bytes && *bytes > 0, "convert: --split-max-size '{}' is not a size (e.g. 4G, 500M)", split_max_size);
        options.split_max_bytes = uint64_t(*bytes);
      }
      if (tokenizer) add_gguf_tokenizer(*tokenizer, config.vocab_size, options.tokenizer);
      const bool tower = config.vision.enabled && config.vision.tower == VisionTower::MoonVit;
      HYLA_CHECK(mmproj_out.empty() || tower, "convert: --mmproj-out, but {} has no MoonViT tower", in);
      if (!mmproj_out.empty())
        HYLA_CHECK(force || !fs::exists(mmproj_out) || is_gguf_file(mmproj_out),
                   "convert: {} exists and is not a GGUF file; give --force to replace it", mmproj_out.string());
      const GgufExport written = save_gguf(out, config, weights, options);
      fmt::print("wrote {}{}: llama.cpp {} GGUF, matrices {}, {}\n", written.files.front().string(),
                 written.files.size() > 1 ? fmt::format(" … {} ({} shards)", written.files.back().string(), written.files.size()) : "",
                 written.arch, type,
                 tokenizer ? "with the vocabulary" : "no vocabulary (token ids only)");
      if (!mmproj_out.empty()) {
        save_moonvit_mmproj(mmproj_out, config, weights);
        fmt::print("wrote {}: llama.cpp mmproj (kimik25), f32\n", mmproj_out.string());
      } else if (tower) {
        fmt::print("the vision tower is not in the text GGUF: give --mmproj-out FILE to write it as an mmproj\n");
      }
      return;
    }
    HYLA_CHECK(mmproj_out.empty(), "convert: --mmproj-out is for --to gguf");
    check_replaceable_output(out, "config.json", {in}, force);
    const DType dtype = weight_dtype == "bf16" ? DType::BF16 : weight_dtype == "f16" ? DType::F16 : DType::F32;
    AtomicDirectory dir(out);
    write_file_atomic(dir.temp() / "config.json", config.to_json().dump(2) + "\n");
    std::map<std::string, std::string> metadata;  // int8 tensors (Q8_0 kept as int8) carry their block
    for (const std::string& name : weights.names())
      if (weights.entry(name).dtype == DType::I8) metadata = weights.metadata_of(name);
    save_safetensors(dir.temp() / "model.safetensors", weights, dtype, metadata);
    // The tokenizer travels as tokenizer.json (a checkpoint's tiktoken.model or a GGUF's vocabulary converted).
    if (tokenizer) tokenizer->save(dir.temp() / "tokenizer.json");
    dir.commit();
    fmt::print("wrote {}: {} tensors, {} weights\n", out, weights.names().size(), weight_dtype);
  });
}

}  // namespace hyla::cli
