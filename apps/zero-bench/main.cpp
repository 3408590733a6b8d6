// zero-bench <command> [options]: zerocpp's benchmarks. Each command measures
// its own ceiling and a baseline in the same run, validates before it times,
// and prints a table plus (with --json) one JSON object as the last line.
// See docs/PERFORMANCE.md for the figures and how they were taken.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "zero/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"zero-bench: zerocpp's benchmarks (each against its own ceiling and a baseline)"};
  app.require_subcommand(1);
  zero::bench::add_adam_command(app);
  zero::bench::add_step_command(app);
  zero::bench::add_fit_plain_command(app);
  zero::bench::add_ckpt_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a usage error: 2
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "zero-bench: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-bench: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
