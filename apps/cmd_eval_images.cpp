// `hyla eval images`: classification and image question answering by greedy generation, with the
// controls (shuffled patches, blank images) and the text-only twin beside it (docs/vision.md).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "commands.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/image_batches.h"
#include "hyla/eval/image_report.h"
#include "hyla/eval/perplexity.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"

namespace hyla::cli {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

void add_eval_images(CLI::App& eval) {
  auto* cmd = eval.add_subcommand("images", "Image classification / question answering accuracy by greedy generation, "
                                            "with shuffled-patch and blank-image controls");
  static std::string model_dir, images_dir, split = "test", controls = "shuffled,blank", dtype = "bf16", text_data,
                     twin_dir, out_file, report_file;
  static int64_t limit = 0, max_tokens = 24, max_sequences = 16, text_seq = 256;
  static uint64_t seed = 1;
  static bool print_json = false;
  cmd->add_option("-m,--model", model_dir, "Model directory (vision.enabled)")->required();
  cmd->add_option("--images", images_dir, "Image records (hyla data prepare-images / prepare-documents)")->required();
  cmd->add_option("--split", split, "Split listed in the records' meta.json");
  cmd->add_option("--limit", limit, "Only the split's first N records (0: all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--controls", controls, "Comma-separated controls to run beside the images: shuffled, blank; none")
      ->check(CLI::IsMember({"shuffled,blank", "blank,shuffled", "shuffled", "blank", "none"}));
  cmd->add_option("--seed", seed, "Seed of the shuffled-patches permutations");
  cmd->add_option("--max-tokens", max_tokens, "Longest answer generated")->check(positive());
  cmd->add_option("--max-sequences", max_sequences, "Sequences decoded together")->check(positive());
  cmd->add_option("--dtype", dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--text-data", text_data, "Token directory whose val split measures the model's text loss");
  cmd->add_option("--twin", twin_dir, "A text-only twin model, measured on --text-data too");
  cmd->add_option("--text-seq", text_seq, "Window of the text loss")->check(positive());
  cmd->add_option("--out", out_file, "Write the JSON summary here");
  cmd->add_option("--report", report_file, "Write a self-contained HTML report here");
  cmd->add_flag("--json", print_json, "Print the JSON summary instead of the table");
  cmd->callback([] {
    HYLA_CHECK(twin_dir.empty() || !text_data.empty(), "--twin needs --text-data (the text both models are measured on)");
    auto model = Model::load(model_dir);
    const Tokenizer tokenizer = load_model_tokenizer(model_dir);
    const ojson meta = parse_json_file((fs::path(images_dir) / "meta.json").string());
    std::vector<std::string> label_names;
    for (const char* key : {"classes", "question_types"})
      if (meta.contains(key))
        for (const auto& n : meta[key]) label_names.push_back(n.get<std::string>());

    std::vector<ImageControl> run_controls = {ImageControl::None};
    if (controls.find("shuffled") != std::string::npos) run_controls.push_back(ImageControl::ShuffledPatches);
    if (controls.find("blank") != std::string::npos) run_controls.push_back(ImageControl::Blank);
    std::vector<ImageEvalRun> runs;
    for (ImageControl control : run_controls) {
      ImageEvalOptions o;
      o.split = split;
      o.limit = limit;
      o.control = control;
      o.seed = seed;
      o.max_tokens = max_tokens;
      o.max_sequences = max_sequences;
      o.precision = dtype == "f32" ? Precision::F32 : Precision::BF16;
      runs.push_back({control, evaluate_images(*model, tokenizer, images_dir, o)});
    }
    ojson summary = {{"model", model_dir}, {"images", images_dir}, {"split", split}, {"seed", seed}};
    ojson data = meta;
    data.erase("splits");
    summary["data"] = data;
    if (!label_names.empty()) summary["label_names"] = label_names;
    summary["runs"] = summarize_image_eval(runs, label_names);
    if (!text_data.empty()) {
      const Precision p = dtype == "f32" ? Precision::F32 : Precision::BF16;
      const PerplexityResult mine = evaluate_perplexity(*model, text_data, "val", text_seq, 4, p, true);
      ojson text = {{"data", text_data}, {"split", "val"}, {"tokens", mine.tokens}, {"model_loss", mine.loss}};
      if (!twin_dir.empty()) {
        auto twin = Model::load(twin_dir);
        const PerplexityResult theirs = evaluate_perplexity(*twin, text_data, "val", text_seq, 4, p, true);
        text["twin"] = twin_dir;
        text["twin_loss"] = theirs.loss;
        text["ratio"] = mine.loss / theirs.loss;
      }
      summary["text"] = text;
    }
    if (!out_file.empty()) write_file_atomic(out_file, summary.dump(2) + "\n");
    if (!report_file.empty()) write_file_atomic(report_file, image_eval_html(summary, runs));
    if (print_json) {
      fmt::print("{}\n", summary.dump(2));
      return;
    }
    for (const auto& [name, r] : summary["runs"].items()) {
      fmt::print("{:<17} accuracy {:5.1f}%  95% CI [{:.1f}, {:.1f}]  ({} of {}, {:.1f} images/s)\n", name,
                 100 * r["accuracy"].get<double>(), 100 * r["ci95"][0].get<double>(), 100 * r["ci95"][1].get<double>(),
                 r["correct"].get<int64_t>(), r["samples"].get<int64_t>(), r["images_per_s"].get<double>());
      if (r["by_label"].size() > 1 && !r.contains("confusion"))
        for (const auto& [label, a] : r["by_label"].items())
          fmt::print("    {:<24} {:5.1f}%  [{:.1f}, {:.1f}]  of {}\n", label, 100 * a["accuracy"].get<double>(),
                     100 * a["ci95"][0].get<double>(), 100 * a["ci95"][1].get<double>(), a["samples"].get<int64_t>());
    }
    if (summary.contains("text")) {
      const ojson& t = summary["text"];
      fmt::print("text val loss {:.4f}", t["model_loss"].get<double>());
      if (t.contains("twin_loss"))
        fmt::print(", text-only twin {:.4f}: ratio {:.4f}", t["twin_loss"].get<double>(), t["ratio"].get<double>());
      fmt::print("\n");
    }
    if (!report_file.empty()) fmt::print("report: {}\n", report_file);
  });
}

}  // namespace hyla::cli
