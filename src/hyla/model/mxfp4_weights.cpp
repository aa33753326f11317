#include "hyla/model/mxfp4_weights.h"

#include "hyla/core/error.h"
#include "hyla/kernels/mxfp4_gemm.h"

namespace hyla {

std::string mxfp4_scale_name(const std::string& weight) { return weight + ".scale"; }

namespace {

void require_no_nan_scale(int64_t bad, const std::string& source, const std::string& weight) {
  HYLA_CHECK(bad < 0, "{}: tensor '{}' holds 0xFF (NaN in E8M0) at index {}; MXFP4 scales are 0..254", source,
             mxfp4_scale_name(weight), bad);
}

}  // namespace

void check_mxfp4_scales(const uint8_t* scales, int64_t n, const std::string& source, const std::string& weight) {
  require_no_nan_scale(mxfp4_first_nan_scale(scales, n), source, weight);
}

void check_mxfp4_weight(const ModelWeights& weights, const std::string& name, const std::string& source) {
  if (const MappedBytes* blocks = weights.mapped_source(name); blocks && blocks->ggml_blocks == GgmlType::MXFP4) {
    require_no_nan_scale(mxfp4_blocks_first_nan_scale(blocks->begin, int64_t(blocks->bytes) / kGgmlMxfp4BlockBytes), source, name);
    return;
  }
  const Tensor scales = weights.get(mxfp4_scale_name(name));
  check_mxfp4_scales(scales.data<uint8_t>(), scales.numel(), source, name);
}

void pack_mxfp4_weight(const ModelWeights& weights, const std::string& name, int64_t rows, int64_t cols,
                       uint8_t* dst, const std::string& source) {
  if (const MappedBytes* blocks = weights.mapped_source(name); blocks && blocks->ggml_blocks == GgmlType::MXFP4) {
    HYLA_ASSERT(int64_t(blocks->bytes) == rows * cols / kMxfp4Block * kGgmlMxfp4BlockBytes);
    require_no_nan_scale(mxfp4_pack_blocks(blocks->begin, rows, cols, dst), source, name);
    return;
  }
  const Tensor codes = weights.get(name), scales = weights.get(mxfp4_scale_name(name));
  check_mxfp4_scales(scales.data<uint8_t>(), scales.numel(), source, name);
  mxfp4_pack(codes.data<uint8_t>(), scales.data<uint8_t>(), rows, cols, dst);
}

}  // namespace hyla
