#pragma once
// One exception type for every user-facing failure: bad files, bad configs, bad requests.
// Messages are one line and name the offending thing (file, key, field) and the broken rule.
// A broken internal invariant is an InternalError instead: a bug in hyla, never the user's fault
// (the server answers it with a 500, not a 400).
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace hyla {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

// What a user is told of an exception that reached a command's or a request's end: a hyla::Error's
// own message; for the standard library's (an allocation that failed, an unchecked index), what
// happened in words, never the library's text ("std::bad_alloc", "map::at").
std::string describe_exception(const std::exception& e);

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace hyla

// Checks a condition that depends on input (files, configs, requests); throws hyla::Error.
#define HYLA_CHECK(cond, ...)          \
  do {                                 \
    if (!(cond)) ::hyla::fail(__VA_ARGS__); \
  } while (0)

// Checks an internal invariant; a failure is a bug in hyla, not bad input.
#define HYLA_ASSERT(cond)                                                                          \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      throw ::hyla::InternalError(fmt::format("internal error: {} failed at {}:{}", #cond, __FILE__, __LINE__)); \
  } while (0)
