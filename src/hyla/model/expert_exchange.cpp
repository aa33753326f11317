#include "hyla/model/expert_exchange.h"

#include <charconv>
#include <string_view>

namespace hyla {

LocalExperts& local_experts() {
  static LocalExperts local;
  return local;
}

int64_t routed_expert_of(const std::string& name) {
  constexpr std::string_view kMarker = ".mlp.experts.";
  const size_t at = name.find(kMarker);
  if (at == std::string::npos) return -1;
  const char* first = name.data() + at + kMarker.size();
  const char* last = name.data() + name.size();
  int64_t expert = -1;
  const auto [end, ec] = std::from_chars(first, last, expert);
  return ec == std::errc() && end != first && end < last && *end == '.' ? expert : -1;
}

std::function<bool(const Param&)> holds_experts(int64_t first, int64_t last) {
  return [first, last](const Param& p) {
    const int64_t e = routed_expert_of(p.name);
    return e < 0 || (e >= first && e < last);
  };
}

}  // namespace hyla
