// `hyla logits`: the f32 logits [T, V] of one token sequence, for cross-implementation checks
// of SPEC (an independent implementation given config.json and model.safetensors must
// reproduce them).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/tokenizer.h"
#include "hyla/dist/expert_serving.h"
#include "hyla/io/json_fields.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/model.h"

namespace hyla::cli {

void add_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "Write the logits [T, V] of a sequence to a safetensors file (key 'logits')");
  static std::string model_dir, tokens_json, text, out, dtype = "f32";
  cmd->add_option("-m,--model", model_dir, "Model directory or GGUF file")->required();
  auto* tokens_opt = cmd->add_option("--tokens", tokens_json, "Token ids as a JSON list, e.g. '[1, 2, 3]'");
  auto* text_opt = cmd->add_option("--text", text, "Text, encoded with the model directory's tokenizer.json");
  tokens_opt->excludes(text_opt);
  cmd->add_option("--out", out, "Output .safetensors file")->required();
  cmd->add_option("--dtype", dtype, "Matmul inputs: f32 (the SPEC contract) or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->callback([] {
    HYLA_CHECK(!tokens_json.empty() || !text.empty(), "logits: give --tokens or --text");
    // f32: the SPEC evaluation of the file's weights, Q8_0 ones decoded too.
    const ModelLoadOptions load{.decode_quantized = dtype == "f32"};
    if (serve_experts_to_rank0(model_dir, load)) return;
    const auto model = load_model_across_processes(model_dir, load);
    ModelInput in;
    if (!text.empty()) {
      const Tokenizer tokenizer = load_model_tokenizer(model_dir);
      in.ids = tokenizer.encode(text, /*allow_special=*/true);
    } else {
      find_model_tokenizer(model_dir);  // the model's tokenizer, if any, refused as the text commands refuse it
      const nlohmann::json ids = parse_json(tokens_json, "--tokens");
      HYLA_CHECK(ids.is_array(), "--tokens must be a JSON list of integers");
      for (const auto& id : ids) {
        HYLA_CHECK(id.is_number_integer(), "--tokens must be a JSON list of integers, got {}", json_excerpt(id));
        in.ids.push_back(id.get<int32_t>());
      }
    }
    HYLA_CHECK(!in.ids.empty(), "logits: the sequence is empty");
    in.tokens = TokenBatch::uniform(1, int64_t(in.ids.size()));
    const Precision precision = dtype == "bf16" ? Precision::BF16 : Precision::F32;
    const Tensor logits = model->forward(in, {.precision = precision, .outputs = Outputs::All}).logits;
    save_safetensors(out, {{"logits", logits}}, {{"dtype", dtype}});
    fmt::print("wrote {} (logits [{}, {}], {} matmul inputs)\n", out, logits.dim(0), logits.dim(1), dtype);
  });
}

}  // namespace hyla::cli
