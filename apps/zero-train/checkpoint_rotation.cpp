#include "checkpoint_rotation.h"

#include <algorithm>
#include <charconv>
#include <system_error>
#include <utility>

#include "zero/ckpt/checkpoint_dir.h"

namespace zero::train {

std::optional<std::int64_t> step_of_tag(const std::string& tag) {
  if (tag.rfind("step-", 0) != 0 || tag.size() == 5) return std::nullopt;
  std::int64_t step = 0;
  const char* b = tag.data() + 5;
  const char* e = tag.data() + tag.size();
  const auto [end, ec] = std::from_chars(b, e, step);
  if (ec != std::errc() || end != e || step < 0) return std::nullopt;
  return step;
}

std::vector<std::string> tags_to_remove(const std::vector<std::string>& tags, std::int64_t newest_step,
                                        std::int64_t keep) {
  std::vector<std::pair<std::int64_t, std::string>> line;
  for (const std::string& tag : tags) {
    const auto step = step_of_tag(tag);
    if (step && *step <= newest_step) line.emplace_back(*step, tag);
  }
  std::sort(line.begin(), line.end());
  std::vector<std::string> out;
  const std::size_t kept = static_cast<std::size_t>(std::max<std::int64_t>(keep, 1));
  for (std::size_t i = 0; i + kept < line.size(); ++i) out.push_back(line[i].second);
  return out;
}

Rotation rotate_checkpoints(const std::filesystem::path& dir, std::int64_t newest_step, std::int64_t keep) {
  Rotation r;
  ckpt::sweep_removals(dir);  // (what a removal killed half-way left)
  for (const std::string& tag : tags_to_remove(ckpt::list_tags(dir), newest_step, keep)) {
    std::error_code ec;
    ckpt::remove_tag(dir, tag, ec);
    if (ec) {
      if (r.error.empty()) r.error = "removing " + (dir / tag).string() + " failed (" + ec.message() + ")";
      continue;
    }
    r.removed.push_back(tag);
  }
  return r;
}

}  // namespace zero::train
