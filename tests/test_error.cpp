// The two kinds of failure: hyla::Error for bad input (the user's to fix; the server answers 4xx)
// and InternalError for a broken invariant (a bug; the server answers 500, the CLI exits 2).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <new>
#include <type_traits>
#include <vector>

#include "hyla/core/error.h"

namespace hyla {
namespace {

TEST(Errors, AnAssertionIsAnInternalErrorNotAUserError) {
  static_assert(!std::is_base_of_v<Error, InternalError> && !std::is_base_of_v<InternalError, Error>);
  try {
    HYLA_ASSERT(1 + 1 == 3);
    ADD_FAILURE() << "no throw";
  } catch (const Error&) {
    ADD_FAILURE() << "an assertion must not look like bad input";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("internal error: 1 + 1 == 3 failed at"), std::string::npos) << e.what();
  }
  EXPECT_THROW(HYLA_CHECK(false, "bad {}", "input"), Error);
}

// Issue 65: the standard library's exceptions reach a user in words, never as its own text.
TEST(Errors, StandardExceptionsAreDescribedWithoutTheLibrarysText) {
  EXPECT_EQ(describe_exception(Error("model.gguf: truncated")), "model.gguf: truncated");
  EXPECT_NE(describe_exception(InternalError("internal error: x failed")).find("a bug in hyla"), std::string::npos);
  std::vector<int> v;
  std::map<std::string, int> m;
  for (const auto& thrower : std::vector<std::function<void()>>{
           [] { throw std::bad_alloc(); }, [&] { (void)v.at(3); }, [&] { (void)m.at("x"); },
           [] { (void)std::string("ab").substr(5); }, [] { throw std::runtime_error("std::something"); }}) {
    try {
      thrower();
      ADD_FAILURE() << "no throw";
    } catch (const std::exception& e) {
      const std::string said = describe_exception(e);
      for (const char* leak : {"std::", "bad_alloc", "map::at", "_M_range_check", "basic_string", "substr"})
        EXPECT_EQ(said.find(leak), std::string::npos) << said << " (from " << e.what() << ")";
      EXPECT_FALSE(said.empty());
    }
  }
  EXPECT_NE(describe_exception(std::bad_alloc()).find("out of memory"), std::string::npos);
}

}  // namespace
}  // namespace hyla
