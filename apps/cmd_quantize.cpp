// `hyla quantize`: a model directory with int8 matrix-product weights or MXFP4 routed experts
// (docs/quantization.md).
#include <fmt/format.h>

#include <string>

#include "commands.h"
#include "hyla/io/file.h"
#include "hyla/quant/quantize_model.h"

namespace hyla::cli {

void add_quantize(CLI::App& app) {
  auto* cmd = app.add_subcommand("quantize", "Write a copy of a model directory with int8 matrix-product weights");
  static std::string in, out, weight_dtype = "int8", experts = "int8";
  static QuantizeOptions o;
  static bool force = false;
  cmd->add_option("-m,--model", in, "Model directory (F32, BF16 or F16 weights) or GGUF file")->required();
  cmd->add_option("--out", out, "Output directory (replaced atomically: only a model directory, unless --force)")->required();
  cmd->add_flag("--force", force, "Replace --out even if it is not an earlier output of this command");
  cmd->add_option("--weight-dtype", weight_dtype, "Weight format")->check(CLI::IsMember({"int8"}));
  refuse_renamed(cmd, "--dtype", "--weight-dtype", kDtypeMeansMatmulInputs);
  cmd->add_option("--block", o.block, "Input features per scale: 16, 32, 64, 128 or 256");
  cmd->add_flag("--keep-lm-head", o.keep_lm_head, "Leave lm_head.weight floating point");
  cmd->add_option("--experts", experts, "The routed experts' format: int8 (as the other matrices) or mxfp4 (E2M1 "
                                        "codes, one E8M0 scale per 32 inputs: 4.25 bits a weight)")
      ->check(CLI::IsMember({"int8", "mxfp4"}));
  cmd->add_flag("--only-experts", o.only_experts, "Quantise the routed experts only; every other weight stays as it is");
  cmd->callback([] {
    check_replaceable_output(out, "config.json", {in}, force);
    o.experts = parse_expert_format(experts);
    const QuantizeSummary s = quantize_model(in, out, o);
    for (const std::string& k : s.kept)
      if (!o.only_experts) fmt::print("kept floating point: {}\n", k);
    std::string written;
    if (s.int8_tensors)
      written += fmt::format("{} weights ({:.2f}M parameters) as int8 with block {}, ", s.int8_tensors,
                             double(s.int8_params) / 1e6, o.block);
    if (s.mxfp4_tensors)
      written += fmt::format("{} routed-expert weights ({:.2f}M) as MXFP4, ", s.mxfp4_tensors, double(s.mxfp4_params) / 1e6);
    fmt::print("wrote {}: {}{} tensors ({:.2f}M) unchanged; tensor data {:.1f} MB -> {:.1f} MB\n", out, written,
               s.float_tensors, double(s.float_params) / 1e6, double(s.bytes_in) / 1e6, double(s.bytes_out) / 1e6);
  });
}

}  // namespace hyla::cli
