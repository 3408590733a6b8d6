// "did you mean ...?" for misspelt config keys.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace zero::config {

// Optimal-string-alignment distance: insertions, deletions, substitutions and
// swaps of two adjacent characters each cost 1 (a swap is the commonest typo:
// "trian_batch_size").
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate most likely meant by `key`, compared case-insensitively: the
// nearest by edit_distance when it is close enough to be a typo (at most
// max(2, key.size() / 4) edits, and fewer edits than key has characters),
// otherwise one that contains key or is contained in it (both of 4 or more
// characters). Ties go to the earlier candidate. nullopt when none fits.
std::optional<std::string_view> closest_key(std::string_view key,
                                            std::span<const std::string_view> candidates);

}  // namespace zero::config
