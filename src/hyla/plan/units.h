#pragma once
// Human-readable numbers for the planner's report: digit grouping, SI prefixes, short counts.
#include <cstdint>
#include <string>

namespace hyla {

std::string grouped(int64_t n);                         // 1234567 -> "1,234,567"
std::string si(double value, const std::string& unit);  // 5.617e12, "B" -> "5.62 TB" (3 significant digits)
std::string short_count(double n);                      // 2.808e12 -> "2.81T", 1.05e11 -> "105B"
std::string duration(double seconds);                   // 1.1e-3 -> "1.10 ms", 1.23e-4 -> "123 us"

}  // namespace hyla
