// The bytes the process's allocator has handed out and not taken back: what
// a test samples to see memory really freed or bounded, where no ledger
// counts it. glibc's malloc: arena blocks in use plus mmap'd chunks; under
// AddressSanitizer, which replaces malloc (mallinfo2 then says 0), its own
// count of live allocations.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__SANITIZE_ADDRESS__)
// The sanitizer runtime's (sanitizer/allocator_interface.h, which not every
// compiler install ships).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#else
#include <malloc.h>
#endif

namespace zero::test {

inline std::int64_t heap_bytes() {
#if defined(__SANITIZE_ADDRESS__)
  return static_cast<std::int64_t>(__sanitizer_get_current_allocated_bytes());
#else
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<std::int64_t>(mi.uordblks + mi.hblkhd);
#endif
}

}  // namespace zero::test
