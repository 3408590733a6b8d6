#include "common/option_suggestion.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace zero::tools {
namespace {

// The name as compared: no leading dashes, nothing from '=', lower case,
// '_' as '-'.
std::string comparable(const std::string& name) {
  std::size_t begin = name.find_first_not_of('-');
  if (begin == std::string::npos) return {};
  std::string out = name.substr(begin, name.find('=') == std::string::npos ? std::string::npos
                                                                           : name.find('=') - begin);
  for (char& c : out) c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Optimal string alignment distance: insertions, deletions, substitutions
// and transpositions of two neighbours ("stpes" -> "steps": 1).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::size_t allowed_distance(const std::string& name) {
  if (name.size() <= 2) return 0;  // ("-x" is one letter from every short name)
  if (name.size() <= 4) return 1;
  return name.size() <= 9 ? 2 : 3;
}

}  // namespace

std::optional<std::string> nearest_option(const std::string& given, const std::vector<std::string>& names) {
  const std::string wanted = comparable(given);
  if (wanted.empty()) return std::nullopt;
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  bool tie = false;
  for (const std::string& name : names) {
    const std::string candidate = comparable(name);
    if (candidate.empty()) continue;
    const std::size_t distance = edit_distance(wanted, candidate);
    if (distance > allowed_distance(candidate)) continue;
    if (!best || distance < best_distance) {
      best = name;
      best_distance = distance;
      tie = false;
    } else if (distance == best_distance && name != *best) {
      tie = true;
    }
  }
  if (best && !tie) return best;
  if (best) return std::nullopt;
  // A beginning of one name alone: "--checkpoint" for "--checkpoint-activations".
  std::optional<std::string> prefixed;
  if (wanted.size() < 3) return std::nullopt;
  for (const std::string& name : names) {
    const std::string candidate = comparable(name);
    if (candidate.size() > wanted.size() && candidate.compare(0, wanted.size(), wanted) == 0) {
      if (prefixed && *prefixed != name) return std::nullopt;
      prefixed = name;
    }
  }
  return prefixed;
}

std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  const auto add_from = [&names](const CLI::App& from) {
    for (const CLI::Option* option : from.get_options()) {
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
      for (const std::string& name : option->get_snames()) names.push_back("-" + name);
    }
  };
  add_from(app);
  for (const CLI::App* sub : app.get_subcommands()) add_from(*sub);
  return names;
}

bool say_near_options(const char* tool, const CLI::App& app, const CLI::ParseError& error) {
  if (dynamic_cast<const CLI::ExtrasError*>(&error) == nullptr) return false;
  const std::vector<std::string> names = option_names(app);
  std::vector<std::string> lines;
  bool any_near = false;
  bool after_option = false;  // (a word after an unknown option is taken as its value, not said again)
  for (const std::string& arg : app.remaining(/*recurse=*/true)) {
    if (arg.size() < 2 || arg[0] != '-') {
      if (!after_option) lines.push_back(std::string{tool} + ": unexpected argument '" + arg + "'");
      after_option = false;
      continue;
    }
    const std::string option = arg.substr(0, arg.find('='));
    const auto near = nearest_option(arg, names);
    any_near = any_near || near.has_value();
    lines.push_back(std::string{tool} + ": unknown option " + option + (near ? ": did you mean " + *near + "?" : ""));
    after_option = option.size() == arg.size();
  }
  if (!any_near) return false;
  for (const std::string& line : lines) std::fprintf(stderr, "%s\n", line.c_str());
  std::fprintf(stderr, "Run with --help for more information.\n");
  return true;
}

}  // namespace zero::tools
