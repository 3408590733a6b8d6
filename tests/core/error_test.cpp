#include "zero/core/error.h"

#include <gtest/gtest.h>

namespace {

TEST(Error, CheckThrowsUserErrorWithMessage) {
  int n = -3;
  try {
    ZERO_CHECK(n > 0, "batch size must be positive, got ", n, "; set train_batch_size");
    FAIL() << "ZERO_CHECK did not throw";
  } catch (const zero::InternalError&) {
    FAIL() << "a user error must not be an InternalError";
  } catch (const zero::Error& e) {
    EXPECT_STREQ(e.what(), "batch size must be positive, got -3; set train_batch_size");
  }
}

TEST(Error, CheckPassesSilently) { EXPECT_NO_THROW(ZERO_CHECK(1 + 1 == 2, "never")); }

TEST(Error, InternalAssertNamesFileAndLine) {
  try {
    ZERO_INTERNAL_ASSERT(false, "offset ", 7);
    FAIL();
  } catch (const zero::InternalError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("error_test.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("offset 7"), std::string::npos) << what;
    EXPECT_NE(what.find("bug in zerocpp"), std::string::npos) << what;
  }
}

}  // namespace
