// zero::cpu_bf16() against the kernel's own reading of CPUID
// (/proc/cpuinfo's flags), and its override variable.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "zero/core/cpu_bf16.h"
#include "zero/core/error.h"

namespace zero {
namespace {

struct EnvGuard {
  explicit EnvGuard(const char* value) {
    if (const char* v = std::getenv("ZERO_CPU_NATIVE_BF16")) saved = v, had = true;
    if (value) {
      setenv("ZERO_CPU_NATIVE_BF16", value, 1);
    } else {
      unsetenv("ZERO_CPU_NATIVE_BF16");
    }
  }
  ~EnvGuard() {
    if (had) {
      setenv("ZERO_CPU_NATIVE_BF16", saved.c_str(), 1);
    } else {
      unsetenv("ZERO_CPU_NATIVE_BF16");
    }
  }
  std::string saved;
  bool had = false;
};

TEST(CpuBf16, AgreesWithTheKernelsCpuFlags) {
#if defined(__x86_64__)
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  ASSERT_FALSE(flags.empty());
  const bool avx512 = flags.find(" avx512_bf16 ") != std::string::npos;
  const bool amx = flags.find(" amx_bf16 ") != std::string::npos;
  const EnvGuard none(nullptr);
  const CpuBf16 r = cpu_bf16();
  EXPECT_EQ(r.native, avx512 || amx) << "cpuinfo flags say avx512_bf16=" << avx512 << " amx_bf16=" << amx
                                     << ", cpu_bf16() says " << r.evidence;
  EXPECT_EQ(r.evidence.find("avx512_bf16") == 0, avx512) << r.evidence;
  EXPECT_EQ(r.evidence.find("amx_bf16") != std::string::npos && r.native, amx) << r.evidence;
#else
  GTEST_SKIP() << "x86 only";
#endif
}

TEST(CpuBf16, TheVariableOverridesBothWaysAndRejectsOtherValues) {
  {
    const EnvGuard on("1");
    EXPECT_TRUE(cpu_bf16().native);
    EXPECT_EQ(cpu_bf16().evidence, "ZERO_CPU_NATIVE_BF16=1");
  }
  {
    const EnvGuard off("0");
    EXPECT_FALSE(cpu_bf16().native);
  }
  const EnvGuard bad("yes");
  try {
    cpu_bf16();
    FAIL() << "ZERO_CPU_NATIVE_BF16=yes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ZERO_CPU_NATIVE_BF16='yes' is not 0 or 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero
