#include "hyla/quant/quantize_model.h"

#include <cmath>

#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/io/file.h"
#include "hyla/io/safetensors.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/mxfp4_gemm.h"
#include "hyla/model/model.h"
#include "hyla/model/model_files.h"
#include "hyla/model/mxfp4_weights.h"

namespace hyla {
namespace fs = std::filesystem;

namespace {

bool is_weights_file(const fs::path& file) {
  const std::string name = file.filename().string();
  return name == "model.safetensors.index.json" || (name.starts_with("model") && name.ends_with(".safetensors"));
}

// The reason a matrix-product weight stays floating point, or "" to quantise it.
std::string reason_to_keep(const Param& p, const ModelConfig& config, const QuantizeOptions& options) {
  if (options.only_experts && p.component != Component::RoutedExperts) return "--only-experts";
  if (options.keep_lm_head && p.name == "lm_head.weight") return "--keep-lm-head";
  // A routed expert's three matrices run in one kernel: all quantised or none.
  const int64_t expert_in = config.moe.latent_dim > 0 ? config.moe.latent_dim : config.hidden_size;
  const int64_t block = options.experts == ExpertFormat::Mxfp4 ? kMxfp4Block : options.block;
  if (p.component == Component::RoutedExperts && (expert_in % block != 0 || config.moe.moe_intermediate_size % block != 0))
    return fmt::format("the routed experts' input {} and width {} are not both multiples of the block {}", expert_in,
                       config.moe.moe_intermediate_size, block);
  if (p.shape[1] % options.block != 0)
    return fmt::format("{} input features are not a multiple of the block {}", p.shape[1], options.block);
  return "";
}

}  // namespace

ExpertFormat parse_expert_format(const std::string& text) {
  if (text == "int8") return ExpertFormat::Int8;
  HYLA_CHECK(text == "mxfp4", "quantize: --experts '{}' is not int8 or mxfp4", text);
  return ExpertFormat::Mxfp4;
}

QuantizeSummary quantize_model(const fs::path& in, const fs::path& out, const QuantizeOptions& options) {
  HYLA_CHECK(int8_block_supported(options.block), "quantize: --block {} is not one of 16, 32, 64, 128, 256",
             options.block);
  HYLA_CHECK(!fs::exists(out) || !fs::equivalent(in, out), "quantize: --out {} is the input directory", out.string());
  const ModelFiles files = open_model_files(in);
  const ModelConfig& config = files.config;
  Model layout(config, /*allocate=*/false);
  ParamStore& params = layout.params();
  const ModelWeights& weights = *files.weights;
  params.plan_storage(weights, in.string());
  HYLA_CHECK(!params.has_quantized(), "{}: already has int8 or MXFP4 weights", in.string());
  const bool mxfp4 = options.experts == ExpertFormat::Mxfp4;

  // Fused parts share their input width, so the block rule keeps or quantises a fused matrix whole.
  QuantizeSummary summary;
  NamedTensors tensors;
  Progress progress("quantize", uint64_t(params.numel()), "params");
  for (const auto& p : params.params()) {
    progress.advance(uint64_t(p->numel()));
    const Tensor t = weights.get(p->name);
    summary.bytes_in += t.nbytes();
    const std::string keep = p->int8_allowed ? reason_to_keep(*p, config, options) : "not a matrix-product weight";
    if (!keep.empty()) {
      if (p->int8_allowed) summary.kept.push_back(fmt::format("{} ({})", p->name, keep));
      tensors.emplace_back(p->name, t);
      summary.float_tensors += 1, summary.float_params += p->numel();
      summary.bytes_out += t.nbytes();
      continue;
    }
    const Tensor w = t.dtype() == DType::F32 ? t : t.to(DType::F32);
    const float* v = w.data<float>();
    for (int64_t i = 0; i < w.numel(); ++i)
      HYLA_CHECK(std::isfinite(v[i]), "{}: tensor '{}' holds {} at index {}; only finite weights can be quantised",
                 in.string(), p->name, v[i], i);
    const int64_t rows = p->shape[0], cols = p->shape[1];
    if (mxfp4 && p->mxfp4_allowed()) {
      Tensor codes = Tensor::empty(DType::U8, {rows, cols / 2}), scales = Tensor::empty(DType::U8, {rows, cols / kMxfp4Block});
      quantize_mxfp4_weights(v, rows, cols, codes.data<uint8_t>(), scales.data<uint8_t>());
      summary.mxfp4_tensors += 1, summary.mxfp4_params += p->numel();
      summary.bytes_out += codes.nbytes() + scales.nbytes();
      tensors.emplace_back(p->name, codes);
      tensors.emplace_back(mxfp4_scale_name(p->name), scales);
      continue;
    }
    Tensor values = Tensor::empty(DType::I8, p->shape), scales = Tensor::empty(DType::F32, {rows, cols / options.block});
    quantize_int8_weights(v, rows, cols, options.block, values.data<int8_t>(), scales.data<float>());
    summary.int8_tensors += 1, summary.int8_params += p->numel();
    summary.bytes_out += values.nbytes() + scales.nbytes();
    tensors.emplace_back(p->name, values);
    tensors.emplace_back(int8_scale_name(p->name), scales);
  }

  progress.finish();
  AtomicDirectory dir(out);
  if (files.format != ModelFiles::Format::Hyla) {  // hyla's config.json, from the GGUF or the HF config
    write_file_atomic(dir.temp() / "config.json", config.to_json().dump(2) + "\n");
  } else {
    for (const fs::directory_entry& e : fs::directory_iterator(in)) {
      if (!e.is_regular_file() || is_weights_file(e.path())) continue;
      std::error_code ec;
      fs::copy_file(e.path(), dir.temp() / e.path().filename(), ec);
      HYLA_CHECK(!ec, "{}: cannot copy into {}: {}", e.path().string(), out.string(), ec.message());
    }
  }
  save_model_weights(dir.temp(), tensors, uint64_t(4) << 30,
                     summary.int8_tensors > 0 ? int8_metadata(options.block) : std::map<std::string, std::string>{});
  dir.commit();
  return summary;
}

}  // namespace hyla
