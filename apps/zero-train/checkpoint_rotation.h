// zero-train --keep-last N: once a checkpoint is committed, the step-<K> tags
// older than the N newest are removed, so that a long run with --save-every
// does not fill its disk. Only this run's line is pruned: tags past the
// newest save (an earlier run's, which a resume from an older tag leaves in
// place and warns of) and tags that are not step-<K> are never touched.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace zero::train {

// K of a "step-K" tag; nullopt for any other tag.
std::optional<std::int64_t> step_of_tag(const std::string& tag);

// Of `tags`, the step-K ones with K <= newest_step that are not among the
// `keep` newest of those, oldest first. keep >= 1.
std::vector<std::string> tags_to_remove(const std::vector<std::string>& tags, std::int64_t newest_step,
                                        std::int64_t keep);

struct Rotation {
  std::vector<std::string> removed;
  std::string error;  // the first removal that failed ("": none)
};
// Removes tags_to_remove(list_tags(dir), newest_step, keep) from dir. A
// removal that fails is reported, not thrown: training goes on.
Rotation rotate_checkpoints(const std::filesystem::path& dir, std::int64_t newest_step, std::int64_t keep);

}  // namespace zero::train
