#pragma once
// A hash map keyed by std::string that can be searched with a std::string_view without building a
// string (heterogeneous lookup), for hot loops over text pieces.
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace hyla {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

template <typename Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

}  // namespace hyla
