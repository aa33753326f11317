// The two kinds of failure: hyla::Error for bad input (the user's to fix; the server answers 4xx)
// and InternalError for a broken invariant (a bug; the server answers 500, the CLI exits 2).
#include <gtest/gtest.h>

#include <type_traits>

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

}  // namespace
}  // namespace hyla
