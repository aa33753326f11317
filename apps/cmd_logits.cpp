// `hyla logits`: the f32 logits [T, V] of one token sequence, for cross-implementation checks
// of SPEC (an independent implementation given config.json and model.safetensors must
// reproduce them). With --image, the images' embeddings (the vision tower's output) take the
// sequence's image-pad rows, and are written too as 'image_embeddings' [rows, d].
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/data/image_file.h"
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
  static std::vector<std::string> image_files;
  static int32_t image_pad_id = -1;
  static std::filesystem::path mmproj;
  cmd->add_option("-m,--model", model_dir, "Model directory or GGUF file")->required();
  auto* tokens_opt = cmd->add_option("--tokens", tokens_json, "Token ids as a JSON list, e.g. '[1, 2, 3]'");
  auto* text_opt = cmd->add_option("--text", text, "Text, encoded with the model directory's tokenizer.json");
  tokens_opt->excludes(text_opt);
  cmd->add_option("--image", image_files, "An image file (PNG or JPEG) whose embeddings take the next image-pad rows (repeatable)");
  cmd->add_option("--image-pad-id", image_pad_id,
                  "The id whose rows the images take (default: the tokenizer's <|media_pad|> or <|image_pad|>)");
  add_mmproj_option(cmd, mmproj);
  cmd->add_option("--out", out, "Output .safetensors file")->required();
  cmd->add_option("--dtype", dtype, "Matmul inputs: f32 (the SPEC contract) or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->callback([] {
    HYLA_CHECK(!tokens_json.empty() || !text.empty(), "logits: give --tokens or --text");
    // f32: the SPEC evaluation of the file's weights, Q8_0 ones decoded too.
    const ModelLoadOptions load{.decode_quantized = dtype == "f32", .mmproj = mmproj};
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
    for (const std::string& file : image_files)
      in.images.push_back(to_model_image(read_image_file(file), model->config().vision, file));
    in.image_pad_id = image_pad_id;
    if (!in.images.empty() && in.image_pad_id < 0) {
      const auto tokenizer = find_model_tokenizer(model_dir);
      HYLA_CHECK(tokenizer, "logits: give --image-pad-id: the model has no tokenizer to name its image-pad token");
      const auto media = tokenizer->token_id("<|media_pad|>");
      const auto pad = media ? media : tokenizer->token_id("<|image_pad|>");
      HYLA_CHECK(pad, "logits: the tokenizer has neither <|media_pad|> nor <|image_pad|>; give --image-pad-id");
      in.image_pad_id = *pad;
    }
    const Tensor logits = model->forward(in, {.precision = precision, .outputs = Outputs::All}).logits;
    NamedTensors tensors = {{"logits", logits}};
    if (!in.images.empty()) tensors.emplace_back("image_embeddings", model->image_embeddings());
    save_safetensors(out, tensors, {{"dtype", dtype}});
    fmt::print("wrote {} (logits [{}, {}], {} matmul inputs)\n", out, logits.dim(0), logits.dim(1), dtype);
  });
}

}  // namespace hyla::cli
