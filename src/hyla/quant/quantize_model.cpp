#include "hyla/quant/quantize_model.h"

#include <cmath>

#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/io/file.h"
#include "hyla/io/safetensors.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/model/model.h"
#include "hyla/model/model_files.h"

namespace hyla {
namespace fs = std::filesystem;

namespace {

bool is_weights_file(const fs::path& file) {
  const std::string name = file.filename().string();
  return name == "model.safetensors.index.json" || (name.starts_with("model") && name.ends_with(".safetensors"));
}

// The reason a matrix-product weight stays floating point, or "" to quantise it.
std::string reason_to_keep(const Param& p, const QuantizeOptions& options) {
  if (options.keep_lm_head && p.name == "lm_head.weight") return "--keep-lm-head";
  if (p.shape[1] % options.block != 0)
    return fmt::format("{} input features are not a multiple of the block {}", p.shape[1], options.block);
  return "";
}

}  // namespace

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
  HYLA_CHECK(!params.has_int8(), "{}: already has int8 weights", in.string());

  // Fused parts share their input width, so the block rule keeps or quantises a fused matrix whole.
  QuantizeSummary summary;
  NamedTensors tensors;
  Progress progress("quantize", uint64_t(params.numel()), "params");
  for (const auto& p : params.params()) {
    progress.advance(uint64_t(p->numel()));
    const Tensor t = weights.get(p->name);
    summary.bytes_in += t.nbytes();
    const std::string keep = p->int8_allowed ? reason_to_keep(*p, options) : "not a matrix-product weight";
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
  save_model_weights(dir.temp(), tensors, uint64_t(4) << 30, int8_metadata(options.block));
  dir.commit();
  return summary;
}

}  // namespace hyla
