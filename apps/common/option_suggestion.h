// "Did you mean --steps?" for an option the tool does not have: the nearest
// of its options by edit distance, the way git and cargo answer a typo.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
class ParseError;
}  // namespace CLI

namespace zero::tools {

// The one name in `names` ("--steps", "-h") nearest to `given` ("--stpes",
// "--save_every=5"), compared without the dashes, any "=value", case and
// the difference between '_' and '-': within an edit distance (with
// transpositions) of 0 for names up to 2 letters, 1 up to 4, 2 up to 9,
// else 3, or the
// one name `given` is a prefix of (3 letters at least). None where nothing
// is near, or two names are equally near.
std::optional<std::string> nearest_option(const std::string& given, const std::vector<std::string>& names);

// The long and short names of `app`'s options and of the subcommands given
// on the command line ("--tag" of `zero-ckpt inspect`).
std::vector<std::string> option_names(const CLI::App& app);

// For a usage error of unexpected arguments (CLI::ExtrasError), where one
// of them has a near name: a line per unexpected argument ("zero-train:
// unknown option --stpes: did you mean --steps?") and true. False, with
// nothing said, for any other error or where no name is near: CLI11's own
// message then.
bool say_near_options(const char* tool, const CLI::App& app, const CLI::ParseError& error);

}  // namespace zero::tools
