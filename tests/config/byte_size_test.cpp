#include "zero/config/byte_size.h"

#include <gtest/gtest.h>

namespace {

using zero::config::format_byte_size;
using zero::config::parse_byte_size;

TEST(ByteSize, PlainNumbersAreBytes) {
  EXPECT_EQ(parse_byte_size("0"), 0);
  EXPECT_EQ(parse_byte_size("1048576"), 1048576);
  EXPECT_EQ(parse_byte_size(" 12 "), 12);
  EXPECT_EQ(parse_byte_size("7B"), 7);
}

TEST(ByteSize, DecimalAndBinaryUnits) {
  EXPECT_EQ(parse_byte_size("2GB"), 2000000000);
  EXPECT_EQ(parse_byte_size("2GiB"), 2LL << 30);
  EXPECT_EQ(parse_byte_size("512MiB"), 512LL << 20);
  EXPECT_EQ(parse_byte_size("1.5 GiB"), 3LL << 29);
  EXPECT_EQ(parse_byte_size("3kb"), 3000);
  EXPECT_EQ(parse_byte_size("3 KIB"), 3072);
  EXPECT_EQ(parse_byte_size("1TB"), 1000000000000LL);
  EXPECT_EQ(parse_byte_size("1 PiB"), 1LL << 50);
}

TEST(ByteSize, FractionsOfAByteAreDropped) {
  EXPECT_EQ(parse_byte_size("0.5B"), 0);
  EXPECT_EQ(parse_byte_size("1.0009KB"), 1000);
  EXPECT_EQ(parse_byte_size("0.1 KiB"), 102);
  // Many fraction digits do not overflow.
  EXPECT_EQ(parse_byte_size("1.99999999999999999999999999 B"), 1);
}

TEST(ByteSize, RefusesWhatIsNotASize) {
  for (const char* bad : {"", " ", "GB", "2G", "2 M", "-1GB", "2.GB", ".5GB", "2 GB x", "2e9",
                          "1,5GiB", "two GB", "2 gigabytes", "0x10"}) {
    EXPECT_EQ(parse_byte_size(bad), std::nullopt) << bad;
  }
}

TEST(ByteSize, RefusesWhatDoesNotFit) {
  EXPECT_EQ(parse_byte_size("9223372036854775807"), 9223372036854775807LL);
  EXPECT_EQ(parse_byte_size("9223372036854775808"), std::nullopt);
  EXPECT_EQ(parse_byte_size("8192 PiB"), std::nullopt);
  EXPECT_EQ(parse_byte_size("8191.99999 PiB").has_value(), true);
  EXPECT_EQ(parse_byte_size("99999999999999999999999 B"), std::nullopt);
}

TEST(ByteSize, Formats) {
  EXPECT_EQ(format_byte_size(100), "100 B");
  EXPECT_EQ(format_byte_size(512LL << 20), "512 MiB");
  EXPECT_EQ(format_byte_size(3LL << 29), "1.50 GiB");
}

}  // namespace
