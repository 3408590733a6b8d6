// zerocpp's tokenizer: one token per byte (vocabulary 256). UTF-8 text of any
// language round-trips, a multi-byte character becomes several tokens, and
// nothing needs training. Header-only: two loops.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zero/core/error.h"

namespace zero::data {

inline constexpr std::int64_t kByteVocabSize = 256;

inline std::vector<std::int64_t> encode_bytes(std::string_view text) {
  std::vector<std::int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

// The inverse of encode_bytes, used by zero-train's sampling. The bytes are
// kept as they are: a sample cut in the middle of a UTF-8 character ends with
// a partial sequence, which a terminal shows as a replacement character.
inline std::string decode_bytes(const std::vector<std::int64_t>& ids) {
  std::string out;
  out.reserve(ids.size());
  for (std::int64_t id : ids) {
    ZERO_CHECK(id >= 0 && id < kByteVocabSize, "token id ", id,
               " is outside the byte vocabulary [0, 256): was the model built with a larger vocab_size?");
    out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  return out;
}

}  // namespace zero::data
