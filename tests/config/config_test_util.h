// Helpers shared by the config tests.
#pragma once

#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "zero/config/config.h"
#include "zero/core/error.h"

namespace zero::config::testing {

inline Config parse(std::string_view text, int world_size = 1) {
  return parse_config(text, world_size, "test.json");
}

// The message of the zero::Error that parsing throws; a test failure (and "")
// when it does not throw one.
inline std::string error_of(std::string_view text, int world_size = 1) {
  try {
    parse(text, world_size);
  } catch (const zero::InternalError& e) {
    ADD_FAILURE() << "internal error: " << e.what();
    return "";
  } catch (const zero::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsing did not fail: " << text;
  return "";
}

// The warnings joined by newlines, for EXPECT_THAT-free substring checks.
inline std::string all_warnings(const Config& c) {
  std::string out;
  for (const std::string& w : c.warnings) out += w + "\n";
  return out;
}

inline bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

}  // namespace zero::config::testing

#define EXPECT_CONTAINS(haystack, needle)                                              \
  EXPECT_TRUE(::zero::config::testing::contains((haystack), (needle)))                 \
      << "expected to find: " << (needle) << "\nin: " << (haystack)
