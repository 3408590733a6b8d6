// zero-bench <command> [options]: zerocpp's benchmarks. Each command measures
// its own ceiling and a baseline in the same run, validates before it times,
// and prints a table plus (with --json) one JSON object as the last line.
// See docs/PERFORMANCE.md for the figures and how they were taken.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "common/option_suggestion.h"
#include "common/usage_rank.h"
#include "zero/comm/launcher_env.h"
#include "zero/core/error.h"
#include "zero/version.h"

namespace zero::bench {

void require_heads_divide(std::int64_t embd, std::int64_t heads) {
  if (embd % heads != 0) {
    throw CLI::ValidationError("--heads", std::to_string(heads) + " does not divide --embd " + std::to_string(embd) +
                                              ": give heads that divide the width");
  }
}

namespace {
std::string given_command;
}  // namespace

const std::string& command_line() { return given_command; }

void require_one_process(const char* command) {
  const int local = comm::launcher_local_size().value_or(1);
  if (local > 1) {
    throw CLI::ValidationError(std::string("zero-bench ") + command + " measures one process, and " +
                               std::to_string(local) + " are on this node under the launcher (they would share "
                               "its cores, each printing its own figures): run it without mpirun");
  }
}

}  // namespace zero::bench

int main(int argc, char** argv) {
  // (Words with a space or a quote are quoted, so that the line runs again.)
  for (int i = 0; i < argc; ++i) {
    std::string word = i == 0 ? std::string("zero-bench") : std::string(argv[i]);
    if (word.find_first_of(" \t'\"$") != std::string::npos) {
      std::string quoted = "'";
      for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      word = quoted + "'";
    }
    zero::bench::given_command += (i ? " " : "") + word;
  }
  CLI::App app{"zero-bench: zerocpp's benchmarks (each against its own ceiling and a baseline)"};
  app.set_version_flag("--version", std::string("zero-bench (zerocpp ") + zero::version() + ")");
  app.require_subcommand(1);
  zero::bench::add_adam_command(app);
  zero::bench::add_step_command(app);
  zero::bench::add_fit_plain_command(app);
  zero::bench::add_ckpt_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    // No subcommand, or a first word that is none: name it and the commands.
    std::string first = argc > 1 ? argv[1] : "";
    if (!first.empty() && first[0] != '-') {
      std::fprintf(stderr, "zero-bench: unknown command '%s': use adam, step, fit-plain or ckpt (--help)\n",
                   first.c_str());
      return 2;
    }
    if (!first.empty() && first != "--help" && first != "-h") {
      std::fprintf(stderr, "zero-bench: '%s' before a command: give a command first (adam, step, fit-plain, ckpt), "
                   "then its options (zero-bench <command> --help)\n", first.c_str());
      return 2;
    }
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const CLI::ParseError& e) {
    if (!zero::tools::says_usage_errors()) return e.get_exit_code() == 0 ? 0 : 2;
    if (zero::tools::say_near_options("zero-bench", app, e)) return 2;
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
