#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace hyla {

enum class DType : uint8_t { F32, BF16, F16, I8, I32, I64, U8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

// Names as written in safetensors headers ("F32", "BF16", ...).
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace hyla
