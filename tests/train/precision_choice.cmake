# zero-train's precision on the CPU (apps/zero-train/train_precision.h), with
# the CPUID check forced both ways by ZERO_CPU_NATIVE_BF16: the embedded
# default becomes fp32 without native bf16 and says so; a config that asks
# for bf16 keeps it, with a warning; with native bf16 the default stays bf16;
# a config that asks for fp16 keeps it, with a warning; a Hugging Face
# config's "auto" precision takes zero-train's default (bf16, fp32 on a CPU
# without native bf16), as the Trainer takes its --bf16/--fp16.
# And a run without evaluation prints no sentinel validation loss.
#   cmake -DTRAIN=<zero-train> -DCORPUS=<file> -DOUT=<dir> -DBF16_CONFIG=<json> -DFP16_CONFIG=<json> -DAUTO_CONFIG=<json> -P precision_choice.cmake
set(common ${CORPUS} --steps 1 --eval-every 0 --device cpu --out ${OUT})
function(run_with value)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ZERO_CPU_NATIVE_BF16=${value} ${TRAIN} ${common} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(rc ${rc} PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

run_with(0)
if(NOT rc EQUAL 0 OR NOT err MATCHES "precision: fp32, not the default's bf16: this CPU has ZERO_CPU_NATIVE_BF16=0"
   OR NOT err MATCHES "stage 2, Float on cpu")
  message(FATAL_ERROR "no native bf16, default config: expected fp32 and the line saying so (status ${rc}):\n${err}")
endif()
# The schedule is said, with where it comes from.
if(NOT err MATCHES "lr: linear warm-up from 0 to 0.003 over 2 steps \\(DeepSpeed's least\\), then cosine down to 0.0003 at step 1 \\(zero-train's schedule: --warmup, --min-lr-ratio\\)")
  message(FATAL_ERROR "default config: expected the lr schedule in words:\n${err}")
endif()
if(err MATCHES "final validation loss" OR NOT err MATCHES "no validation loss: no evaluation ran \\(--eval-every 0\\)")
  message(FATAL_ERROR "--eval-every 0: expected 'no validation loss', no number:\n${err}")
endif()

# The last run exited 0 and said each of the patterns (ARGN).
function(expect_said what)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what}: exit status ${rc}:\n${err}")
  endif()
  foreach(pattern ${ARGN})
    if(NOT err MATCHES "${pattern}")
      message(FATAL_ERROR "${what}: expected '${pattern}':\n${err}")
    endif()
  endforeach()
endfunction()

run_with(1)
expect_said("native bf16, default config" "precision: bf16 \\(this CPU computes bf16 natively" "stage 2, BFloat16 on cpu")

run_with(0 --config ${BF16_CONFIG})
expect_said("no native bf16, bf16 config (with a warning, and zero-train's schedule said as such)"
            "warning: the config asks for bf16, but this CPU has ZERO_CPU_NATIVE_BF16=0: bf16 is emulated"
            "BFloat16 on cpu"
            "\\(zero-train's schedule, as the config has no \"scheduler\"; --warmup 0 --min-lr-ratio 1 keeps the lr constant")

# fp16 on the CPU: kept, with a warning of its cost (no bf16 check in it).
run_with(1 --config ${FP16_CONFIG})
expect_said("fp16 config on the CPU" "warning: the config asks for fp16, which the CPU computes slowly" "stage 2, Half on cpu")

# "auto" precision (a Hugging Face Trainer config): zero-train's default,
# bf16, where the CPU computes it natively; else fp32, said as for the
# embedded default (not the warning a config's own bf16 gets).
run_with(1 --config ${AUTO_CONFIG})
expect_said("\"auto\" precision, native bf16"
            "\"auto\" values, filled as the Hugging Face Trainer fills them: bf16.enabled = true \\(zero-train's default precision\\), fp16.enabled = false"
            "precision: bf16 \\(this CPU computes bf16 natively" "stage 2, BFloat16 on cpu")
run_with(0 --config ${AUTO_CONFIG})
expect_said("\"auto\" precision, no native bf16"
            "bf16.enabled = true \\(zero-train's default precision\\)"
            "precision: fp32, not the default's bf16: this CPU has ZERO_CPU_NATIVE_BF16=0" "stage 2, Float on cpu")
if(err MATCHES "warning: the config asks for bf16" OR err MATCHES "is \"auto\"")
  message(FATAL_ERROR "\"auto\" precision: warned as a config's own bf16, or left \"auto\":\n${err}")
endif()

run_with(maybe)
if(rc EQUAL 0 OR NOT err MATCHES "ZERO_CPU_NATIVE_BF16='maybe' is not 0 or 1")
  message(FATAL_ERROR "ZERO_CPU_NATIVE_BF16=maybe: expected an error naming it (status ${rc}):\n${err}")
endif()
message(STATUS "precision choice: ok")
