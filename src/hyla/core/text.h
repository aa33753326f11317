#pragma once
// Small text helpers shared by the chat format, evaluators and the HTML reports.
#include <string>
#include <string_view>

namespace hyla {

// Without leading and trailing spaces, tabs, carriage returns and newlines.
inline std::string_view trim_space(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// Text safe inside HTML elements and double-quoted attributes.
inline std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace hyla
