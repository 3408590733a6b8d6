// Whether this CPU computes in bf16 natively: AVX512_BF16 or AMX-BF16 on x86
// (CPUID), which LibTorch's CPU kernels use for bf16 matmuls. Without them
// bf16 is emulated: on an AMD EPYC (Zen 3, neither present) a GPT trained
// 22x slower in bf16 than in fp32 (issue 14; docs/train.md). The tools pick
// fp32 on such CPUs unless the config asks for bf16.
#pragma once

#include <string>

namespace zero {

struct CpuBf16 {
  bool native = false;
  // What decided it, for messages: "avx512_bf16", "amx_bf16", "avx512_bf16
  // amx_bf16", "none of avx512_bf16, amx_bf16", or "ZERO_CPU_NATIVE_BF16=0|1".
  std::string evidence;
};

// ZERO_CPU_NATIVE_BF16=1 or 0 overrides the CPUID check (tests, and a user
// who measured otherwise); any other value is a zero::Error naming it.
CpuBf16 cpu_bf16();

}  // namespace zero
