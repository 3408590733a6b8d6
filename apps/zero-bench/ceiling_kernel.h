// The memory-bandwidth ceiling of a CPU Adam step, measured in the same run
// (docs/design.md, "Performance method"): in-place kernels that move exactly the
// streams of the real step with trivial arithmetic, on the same SIMD target
// family, threads and tiles. STREAM triad is not this ceiling: it writes a
// separate array (paying a read-for-ownership) where Adam updates in place.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero::optim {
class ThreadPool;
}

namespace zero::bench {

// fp32 grads: reads p, g, m, v; writes p, m, v (28 bytes per element).
//   p += g; m += g; v += g
void ceiling_step_fp32(float* p, const float* g, float* m, float* v, std::size_t n,
                       optim::ThreadPool* pool, std::size_t prefetch);

// bf16 grads with a bf16 copy of p: reads p, m, v (fp32) and g (bf16); writes
// p, m, v (fp32) and the copy (bf16) (28 bytes per element, the copy a
// write-only stream).   g = widen(g16); p += g; m += g; v += g; half = top16(p)
void ceiling_step_bf16(float* p, const std::uint16_t* g, float* m, float* v,
                       std::uint16_t* half_out, std::size_t n, optim::ThreadPool* pool,
                       std::size_t prefetch);

// Lion, fp32 grads: reads p, g, m; writes p, m (20 bytes per element).
//   p += g; m += g
void ceiling_step_lion(float* p, const float* g, float* m, std::size_t n, optim::ThreadPool* pool,
                       std::size_t prefetch);

// `prefetch`: software prefetch distance in elements, as the Adam kernel
// issues it (0: none). All run over `pool` in tiles of optim::kTileElements.
//
// The Highway target the ceiling kernels run on (the best one).
const char* ceiling_simd_target();

}  // namespace zero::bench
