// The subcommands of zero-bench. Each lives in its own file and registers
// itself on the CLI11 app; main.cpp only lists them.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace zero::bench {

// adam and fit-plain measure one process: under mpirun with several ranks
// on a node they would share its cores and each print its own figures.
// A usage error (CLI::ValidationError) there.
void require_one_process(const char* command);
// --heads divides --embd (step, ckpt): a usage error otherwise.
void require_heads_divide(std::int64_t embd, std::int64_t heads);
// The command line as given ("zero-bench adam --iters 20 --json"), which
// every command's JSON records as "command", so that a figure kept from it
// carries what made it (docs/PERFORMANCE.md). Set by main().
const std::string& command_line();

// `zero-bench adam`: CPU Adam against its memory-bandwidth ceiling, LibTorch
// and DeepSpeed (adam_bench.cpp).
void add_adam_command(CLI::App& app);

// `zero-bench step`: training step time of a GPT, plain LibTorch loop vs
// zerocpp's stages, offload and DPU (step_bench.cpp). Run it under mpirun.
void add_step_command(CLI::App& app);

// `zero-bench fit-plain`: the largest GPT a plain LibTorch loop (AdamW, bf16
// autocast) trains on one device (CPU or CUDA), its TFLOP/s and peak memory,
// against a bf16 matmul peak measured in the same run (fit_plain_bench.cpp).
void add_fit_plain_command(CLI::App& app);

// `zero-bench ckpt`: checkpoint save/load throughput against the disk's
// sequential speed in the same run, and the async-save stall (ckpt_bench.cpp).
void add_ckpt_command(CLI::App& app);

}  // namespace zero::bench
