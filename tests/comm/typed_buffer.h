// A flat buffer of one DType whose elements tests read and write as floats
// (through the RNE conversions of core/half.h), so one test body covers every
// dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zero/core/dtype.h"
#include "zero/core/half.h"

namespace zero::comm::testing {

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

class TypedBuffer {
 public:
  TypedBuffer(DType dtype, std::size_t size)
      : dtype_(dtype), size_(size), bytes_(size * element_size(dtype)) {}

  DType dtype() const { return dtype_; }
  std::size_t size() const { return size_; }
  // Null when empty, as a caller with nothing to send may pass.
  void* data() { return size_ == 0 ? nullptr : bytes_.data(); }
  const void* data() const { return size_ == 0 ? nullptr : bytes_.data(); }
  // Address of element i (i may be size(), one past the end).
  void* at(std::size_t i) { return bytes_.data() + i * element_size(dtype_); }

  void set(std::size_t i, float v) {
    unsigned char* p = bytes_.data() + i * element_size(dtype_);
    if (dtype_ == DType::kFloat32) {
      std::memcpy(p, &v, 4);
    } else {
      const std::uint16_t h = dtype_ == DType::kBFloat16 ? float_to_bf16(v) : float_to_fp16(v);
      std::memcpy(p, &h, 2);
    }
  }

  float get(std::size_t i) const {
    const unsigned char* p = bytes_.data() + i * element_size(dtype_);
    if (dtype_ == DType::kFloat32) {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return dtype_ == DType::kBFloat16 ? bf16_to_float(h) : fp16_to_float(h);
  }

  // The exact bits of element i, for comparisons that must be bitwise.
  std::uint32_t bits(std::size_t i) const {
    std::uint32_t u = 0;
    std::memcpy(&u, bytes_.data() + i * element_size(dtype_), element_size(dtype_));
    return u;
  }

  void fill(float v) {
    for (std::size_t i = 0; i < size_; ++i) set(i, v);
  }

 private:
  DType dtype_;
  std::size_t size_;
  std::vector<unsigned char> bytes_;
};

}  // namespace zero::comm::testing
