#include "hyla/model/weight_values.h"

#include <algorithm>
#include <cstring>

#include "hyla/core/error.h"
#include "hyla/core/half.h"
#include "hyla/kernels/mxfp4_gemm.h"

namespace hyla {
namespace {

// The first element whose exponent bits are all ones (NaN or infinity): a branch-free OR over each
// chunk, which the compiler vectorises, then a search inside the chunk that has one.
template <typename Bits>
int64_t first_all_ones_exponent(const void* data, int64_t n, Bits mask) {
  constexpr int64_t kChunk = 4096;
  const auto bits = [&](int64_t i) {
    Bits b;
    std::memcpy(&b, static_cast<const uint8_t*>(data) + i * int64_t(sizeof(Bits)), sizeof b);
    return b;
  };
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    bool any = false;
    for (int64_t i = start; i < end; ++i) any |= (bits(i) & mask) == mask;
    if (!any) continue;
    for (int64_t i = start; i < end; ++i)
      if ((bits(i) & mask) == mask) return i;
  }
  return -1;
}

float value_at(const void* data, DType dtype, int64_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (dtype == DType::F32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t b;
  std::memcpy(&b, p + 2 * i, 2);
  return dtype == DType::BF16 ? to_f32(bf16{b}) : to_f32(f16{b});
}

bool is_scale_of(const ModelWeights& weights, const std::string& name, DType codes) {
  if (!name.ends_with(".scale")) return false;
  const std::string base = name.substr(0, name.size() - 6);
  return weights.contains(base) && weights.entry(base).dtype == codes;
}

}  // namespace

int64_t first_non_finite(const void* data, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::F32: return first_all_ones_exponent<uint32_t>(data, n, 0x7f800000u);
    case DType::BF16: return first_all_ones_exponent<uint16_t>(data, n, uint16_t(0x7f80));
    case DType::F16: return first_all_ones_exponent<uint16_t>(data, n, uint16_t(0x7c00));
    default: return -1;
  }
}

void check_float_values(const Tensor& t, const std::string& file, const std::string& name) {
  const DType dtype = t.dtype();
  HYLA_ASSERT(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16);
  const int64_t bad = first_non_finite(t.raw(), dtype, t.numel());
  HYLA_CHECK(bad < 0, "{}: tensor '{}' ({}) holds {} at index {}; weights must be finite", file, name, dtype_name(dtype),
             value_at(t.raw(), dtype, bad), bad);
}

void check_weight_values(const ModelWeights& weights, const std::string& name) {
  const std::string& file = weights.file_of(name);
  if (const MappedBytes* m = weights.mapped_source(name); m && m->ggml_blocks) {
    const GgmlType type = *m->ggml_blocks;
    const int64_t blocks = int64_t(m->bytes) / ggml_block_bytes(type);
    if (type == GgmlType::MXFP4) {
      const int64_t bad = mxfp4_blocks_first_nan_scale(m->begin, blocks);
      HYLA_CHECK(bad < 0, "{}: tensor '{}' (MXFP4): block {} has scale 0xFF (NaN in E8M0); MXFP4 scales are 0..254",
                 file, name, bad);
      return;
    }
    const int64_t bad = ggml_first_nonfinite_block(type, m->begin, blocks);
    HYLA_CHECK(bad < 0, "{}: tensor '{}' ({}): block {} has a scale that is not finite", file, name,
               ggml_type_name(uint32_t(type)), bad);
    return;
  }
  const DType dtype = weights.entry(name).dtype;
  if (dtype == DType::U8 && is_scale_of(weights, name, DType::U8)) {
    const Tensor scales = weights.get(name);
    const int64_t bad = mxfp4_first_nan_scale(scales.data<uint8_t>(), scales.numel());
    HYLA_CHECK(bad < 0, "{}: tensor '{}' holds 0xFF (NaN in E8M0) at index {}; MXFP4 scales are 0..254", file, name, bad);
    return;
  }
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16) return;  // codes: any value is one
  const Tensor t = weights.get(name);
  check_float_values(t, file, name);
  if (dtype == DType::F32 && is_scale_of(weights, name, DType::I8)) {
    const float* s = t.data<float>();
    const auto negative = std::find_if(s, s + t.numel(), [](float x) { return x < 0; });
    HYLA_CHECK(negative == s + t.numel(), "{}: tensor '{}' holds {} at index {}; int8 scales are >= 0", file, name,
               *negative, negative - s);
  }
}

}  // namespace hyla
