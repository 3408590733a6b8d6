#include "zero/core/cpu_bf16.h"

#include <cstdlib>
#include <string>

#include "zero/core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace zero {

CpuBf16 cpu_bf16() {
  if (const char* env = std::getenv("ZERO_CPU_NATIVE_BF16")) {
    const std::string v = env;
    ZERO_CHECK(v == "0" || v == "1", "ZERO_CPU_NATIVE_BF16='", v,
               "' is not 0 or 1: set it to 1 (this CPU computes bf16 natively) or 0 (it does not), or unset "
               "it to let CPUID decide");
    return CpuBf16{v == "1", "ZERO_CPU_NATIVE_BF16=" + v};
  }
  CpuBf16 r;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  bool avx512_bf16 = false, amx_bf16 = false;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    amx_bf16 = (d >> 22) & 1u;  // CPUID.(EAX=7,ECX=0):EDX[22]
    const unsigned max_subleaf = a;
    if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
      avx512_bf16 = (a >> 5) & 1u;  // CPUID.(EAX=7,ECX=1):EAX[5]
    }
  }
  r.native = avx512_bf16 || amx_bf16;
  if (avx512_bf16) r.evidence = "avx512_bf16";
  if (amx_bf16) r.evidence += r.evidence.empty() ? "amx_bf16" : " amx_bf16";
  if (!r.native) r.evidence = "none of avx512_bf16, amx_bf16";
#else
  r.evidence = "not an x86 CPU (no check for native bf16 here)";
#endif
  return r;
}

}  // namespace zero
