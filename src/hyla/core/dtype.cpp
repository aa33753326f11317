#include "hyla/core/dtype.h"

#include <array>
#include <utility>

namespace hyla {

namespace {
constexpr std::array<std::pair<DType, std::string_view>, 7> kNames{{
    {DType::F32, "F32"}, {DType::BF16, "BF16"}, {DType::F16, "F16"},
    {DType::I8, "I8"},   {DType::I32, "I32"},   {DType::I64, "I64"},
    {DType::U8, "U8"},
}};
}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& [dtype, name] : kNames)
    if (dtype == t) return name;
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& [dtype, n] : kNames)
    if (n == name) return dtype;
  return std::nullopt;
}

}  // namespace hyla
