// Shared helpers of the optim/ tests: deterministic data, buffers that can be
// deliberately misaligned, grads in any dtype, and element-wise comparison.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zero/core/dtype.h"
#include "zero/core/half.h"

namespace zero::optim::test {

// n elements of T stored `offset` elements into an over-allocated vector, so a
// test can hand the kernels pointers that are off vector alignment.
template <typename T>
class Span {
 public:
  Span(std::size_t n, std::size_t offset) : storage_(n + offset + 1), offset_(offset), n_(n) {}
  T* data() { return storage_.data() + offset_; }
  const T* data() const { return storage_.data() + offset_; }
  std::size_t size() const { return n_; }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }

 private:
  std::vector<T> storage_;
  std::size_t offset_;
  std::size_t n_;
};

// Grads of any dtype: fp32 values rounded to the dtype, stored raw.
class GradSpan {
 public:
  GradSpan(std::size_t n, DType type, std::size_t offset)
      : bytes_((n + offset + 1) * 4), offset_bytes_(offset * element_size(type)), type_(type), n_(n) {}
  void set(std::size_t i, float v) {
    unsigned char* p = data_bytes() + i * element_size(type_);
    if (type_ == DType::kFloat32) {
      std::memcpy(p, &v, 4);
    } else {
      const std::uint16_t h = type_ == DType::kBFloat16 ? float_to_bf16(v) : float_to_fp16(v);
      std::memcpy(p, &h, 2);
    }
  }
  const void* data() const { return bytes_.data() + offset_bytes_; }
  DType type() const { return type_; }

 private:
  unsigned char* data_bytes() { return bytes_.data() + offset_bytes_; }
  std::vector<unsigned char> bytes_;
  std::size_t offset_bytes_;
  DType type_;
  std::size_t n_;
};

// Relative closeness as the tests state it; NaN only matches NaN.
inline bool close(float a, float b, float rel = 1e-6f) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == b) return true;  // also equal infinities
  return std::fabs(a - b) <= rel * std::fmax(std::fabs(a), std::fabs(b));
}

// Counts elements that are not close(); reports the first few.
inline std::size_t count_mismatches(const float* got, const float* want, std::size_t n,
                                    const std::string& what, float rel = 1e-6f) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!close(got[i], want[i], rel)) {
      if (bad < 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
      }
      ++bad;
    }
  }
  return bad;
}

// half_out == grads (the one overlap the buffer contracts allow, which the
// engine's GPU offload uses), for a one-state optimizer: `step(step_number,
// params, grads, dtype, state, n, half_out)` stepped on separate buffers and
// in place from the same start must give the same bits, with each gradient
// replaced by its updated parameter; on the tail, across tiles and threads.
template <typename StepFn>
void expect_half_out_may_be_the_grads(float state_init, StepFn&& step) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (std::size_t n : {1, 17, 100003, 300001}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      std::mt19937 rng(static_cast<unsigned>(n));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> p1(n), s1(n, state_init);
      std::vector<std::uint16_t> g1(n), half1(n);
      for (std::size_t i = 0; i < n; ++i) {
        p1[i] = normal(rng);
        const float g = normal(rng);
        g1[i] = dt == DType::kBFloat16 ? float_to_bf16(g) : float_to_fp16(g);
      }
      std::vector<float> p2 = p1, s2 = s1;
      std::vector<std::uint16_t> g2 = g1;
      for (int k = 1; k <= 3; ++k) {
        step(k, p1.data(), g1.data(), dt, s1.data(), n, half1.data());
        step(k, p2.data(), g2.data(), dt, s2.data(), n, g2.data());
        ASSERT_EQ(p1, p2) << "step " << k;
        ASSERT_EQ(s1, s2) << "step " << k;
        ASSERT_EQ(half1, g2) << "step " << k << ": the grads were not replaced by the updated parameters";
        g2 = g1;  // the next step's gradients, the same for both
      }
    }
  }
}

inline std::string target_label(const std::string& name) { return name; }

}  // namespace zero::optim::test
