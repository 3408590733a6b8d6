#include "train_precision.h"

namespace zero::train {

namespace {
constexpr const char* kCost = "a GPT trained 22x slower in bf16 than in fp32 on such a CPU (AMD EPYC, Zen 3)";
}

PrecisionChoice choose_precision(bool on_cpu, bool bf16_asked, bool config_given, const CpuBf16& cpu) {
  if (!on_cpu || !bf16_asked) return {bf16_asked, ""};
  if (cpu.native) return {true, "precision: bf16 (this CPU computes bf16 natively: " + cpu.evidence + ")"};
  if (!config_given) {
    return {false, "precision: fp32, not the default's bf16: this CPU has " + cpu.evidence +
                       ", so bf16 would be emulated (" + kCost +
                       "); a --config with \"bf16\": {\"enabled\": true} insists on bf16"};
  }
  return {true, "warning: the config asks for bf16, but this CPU has " + cpu.evidence +
                    ": bf16 is emulated here (" + kCost + "); \"bf16\": {\"enabled\": false} trains in fp32"};
}

}  // namespace zero::train
