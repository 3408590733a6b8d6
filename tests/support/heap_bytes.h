// The bytes glibc's malloc has handed out and not taken back (arena blocks
// in use plus mmap'd chunks): what a test samples to see memory really
// freed or bounded, where no ledger counts it.
#pragma once

#include <malloc.h>

#include <cstdint>

namespace zero::test {

inline std::int64_t heap_bytes() {
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<std::int64_t>(mi.uordblks + mi.hblkhd);
}

}  // namespace zero::test
