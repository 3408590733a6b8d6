// Which SIMD instruction set the optimizer kernels run on.
//
// The kernels are compiled once per target (Highway's foreach_target.h: SSSE3,
// SSE4, AVX2, AVX3 (AVX-512) and a portable SCALAR/EMU128 fallback on x86) and
// the best one this CPU supports is chosen at run time, so one binary runs
// everywhere and never needs -march=native.
//
// Tunable: ZERO_SIMD_TARGET=<name> (read once, at the first kernel call or
// query) forces one target, e.g. for a benchmark or to rule out a target in a
// bug hunt. An unknown or unsupported name is a zero::Error that lists the
// valid ones.
#pragma once

#include <string>
#include <vector>

namespace zero::optim {

// Targets compiled into this binary AND supported by this CPU, best first,
// by Highway's names ("AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "EMU128" or
// "SCALAR").
std::vector<std::string> available_simd_targets();

// The target the kernels use now.
std::string active_simd_target();

// Makes every later kernel call use `name` (one of available_simd_targets());
// "" goes back to the best one. Throws zero::Error for an unknown or
// unsupported name. Do not call while a kernel runs on another thread.
void force_simd_target(const std::string& name);

}  // namespace zero::optim
