// Ceiling kernels for `zero-bench adam` (see ceiling_kernel.h), per SIMD
// target like the optimizer kernels, dispatched to the best target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ceiling_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "ceiling_kernel.h"

HWY_BEFORE_NAMESPACE();
namespace zero::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Prefetching as the Adam kernel does (adam_kernel.cpp): every stream,
// `prefetch` elements ahead (0: none), once per 64-byte line of fp32, the
// address clamped to the last element.
template <class Body>
HWY_INLINE void ForEachVector(std::size_t begin, std::size_t end, std::size_t lanes,
                              std::size_t prefetch, std::size_t last,
                              const Body& body) {
  const std::size_t step = std::max<std::size_t>(16, lanes);
  std::size_t i = begin;
  for (; i + step <= end; i += step) {
    if (prefetch != 0) body.prefetch(std::min(i + prefetch, last));
    for (std::size_t j = i; j < i + step; j += lanes) body(j);
  }
  for (; i + lanes <= end; i += lanes) body(i);
}

// Elements [begin, end) of a span of n; the tail is scalar (a handful of
// elements of a multi-megabyte span, invisible in the timing).
void CeilingFp32(float* p, const float* g, float* m, float* v, std::size_t begin,
                 std::size_t end, std::size_t n, std::size_t prefetch) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  struct Body {
    float *p, *m, *v;
    const float* g;
    hn::ScalableTag<float> d;
    HWY_INLINE void prefetch(std::size_t a) const {
      hwy::Prefetch(p + a);
      hwy::Prefetch(g + a);
      hwy::Prefetch(m + a);
      hwy::Prefetch(v + a);
    }
    HWY_INLINE void operator()(std::size_t i) const {
      const auto gv = hn::LoadU(d, g + i);
      hn::StoreU(hn::Add(hn::LoadU(d, p + i), gv), d, p + i);   // p += g
      hn::StoreU(hn::Add(hn::LoadU(d, m + i), gv), d, m + i);   // m += g
      hn::StoreU(hn::Add(hn::LoadU(d, v + i), gv), d, v + i);   // v += g
    }
  } body{p, m, v, g, d};
  ForEachVector(begin, end, lanes, prefetch, n - 1, body);
  for (std::size_t i = begin + (end - begin) / lanes * lanes; i < end; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

void CeilingLion(float* p, const float* g, float* m, std::size_t begin, std::size_t end, std::size_t n,
                 std::size_t prefetch) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  struct Body {
    float *p, *m;
    const float* g;
    hn::ScalableTag<float> d;
    HWY_INLINE void prefetch(std::size_t a) const {
      hwy::Prefetch(p + a);
      hwy::Prefetch(g + a);
      hwy::Prefetch(m + a);
    }
    HWY_INLINE void operator()(std::size_t i) const {
      const auto gv = hn::LoadU(d, g + i);
      hn::StoreU(hn::Add(hn::LoadU(d, p + i), gv), d, p + i);   // p += g
      hn::StoreU(hn::Add(hn::LoadU(d, m + i), gv), d, m + i);   // m += g
    }
  } body{p, m, g, d};
  ForEachVector(begin, end, lanes, prefetch, n - 1, body);
  for (std::size_t i = begin + (end - begin) / lanes * lanes; i < end; ++i) {
    p[i] += g[i];
    m[i] += g[i];
  }
}

void CeilingBf16(float* p, const std::uint16_t* g, float* m, float* v, std::uint16_t* half_out,
                 std::size_t begin, std::size_t end, std::size_t n, std::size_t prefetch) {
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  struct Body {
    float *p, *m, *v;
    const std::uint16_t* g;
    std::uint16_t* half_out;
    hn::ScalableTag<float> d;
    HWY_INLINE void prefetch(std::size_t a) const {
      hwy::Prefetch(p + a);
      hwy::Prefetch(g + a);
      hwy::Prefetch(m + a);
      hwy::Prefetch(v + a);
    }
    HWY_INLINE void operator()(std::size_t i) const {
      const hn::RebindToUnsigned<decltype(d)> du;
      const hn::RebindToSigned<decltype(d)> di;
      const hn::Rebind<std::uint16_t, decltype(d)> du16;
      // g = bf16 << 16
      const auto gv =
          hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, g + i))));
      const auto pv = hn::Add(hn::LoadU(d, p + i), gv);
      hn::StoreU(pv, d, p + i);
      hn::StoreU(hn::Add(hn::LoadU(d, m + i), gv), d, m + i);
      hn::StoreU(hn::Add(hn::LoadU(d, v + i), gv), d, v + i);
      // half = p >> 16 (truncation: the trivial stand-in for the rounding)
      hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, pv)))),
                 du16, half_out + i);
    }
  } body{p, m, v, g, half_out, d};
  ForEachVector(begin, end, lanes, prefetch, n - 1, body);
  for (std::size_t i = begin + (end - begin) / lanes * lanes; i < end; ++i) {
    float gf;
    const std::uint32_t bits = std::uint32_t{g[i]} << 16;
    std::memcpy(&gf, &bits, 4);
    p[i] += gf;
    m[i] += gf;
    v[i] += gf;
    std::uint32_t pb;
    std::memcpy(&pb, &p[i], 4);
    half_out[i] = static_cast<std::uint16_t>(pb >> 16);
  }
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace zero::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "zero/optim/thread_pool.h"

namespace zero::bench {

HWY_EXPORT(CeilingFp32);
HWY_EXPORT(CeilingBf16);
HWY_EXPORT(CeilingLion);
HWY_EXPORT(TargetName);

namespace {
template <typename Fn>
void run(optim::ThreadPool* pool, std::size_t n, Fn&& fn) {
  if (pool == nullptr || pool->num_threads() <= 1 || n <= optim::kTileElements) {
    fn(std::size_t{0}, n);
  } else {
    pool->parallel_for(n, optim::kTileElements, fn);
  }
}
}  // namespace

void ceiling_step_fp32(float* p, const float* g, float* m, float* v, std::size_t n,
                       optim::ThreadPool* pool, std::size_t prefetch) {
  run(pool, n, [&](std::size_t begin, std::size_t end) {
    HWY_DYNAMIC_DISPATCH(CeilingFp32)(p, g, m, v, begin, end, n, prefetch);
  });
}

void ceiling_step_bf16(float* p, const std::uint16_t* g, float* m, float* v,
                       std::uint16_t* half_out, std::size_t n, optim::ThreadPool* pool,
                       std::size_t prefetch) {
  run(pool, n, [&](std::size_t begin, std::size_t end) {
    HWY_DYNAMIC_DISPATCH(CeilingBf16)(p, g, m, v, half_out, begin, end, n, prefetch);
  });
}

void ceiling_step_lion(float* p, const float* g, float* m, std::size_t n, optim::ThreadPool* pool,
                       std::size_t prefetch) {
  run(pool, n, [&](std::size_t begin, std::size_t end) {
    HWY_DYNAMIC_DISPATCH(CeilingLion)(p, g, m, begin, end, n, prefetch);
  });
}

const char* ceiling_simd_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace zero::bench
#endif  // HWY_ONCE
