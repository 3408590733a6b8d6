// CRC-32C (Castagnoli), the checksum of every checkpoint file: the SSE4.2
// instruction where the CPU has it (~10 GB/s on one core, faster than any
// disk), a table otherwise. Incremental: crc32c(crc32c(0, a), b) equals the
// checksum of a followed by b.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero::ckpt {

std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t n);

}  // namespace zero::ckpt
