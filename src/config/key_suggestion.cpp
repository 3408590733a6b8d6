#include "zero/config/key_suggestion.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace zero::config {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rolling rows (the swap looks two rows back), so memory is O(|b|)
  // even for a long key from a fuzzer.
  const std::size_t n = b.size();
  std::vector<std::size_t> before(n + 1), prev(n + 1), cur(n + 1);
  for (std::size_t j = 0; j <= n; ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= n; ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        cur[j] = std::min(cur[j], before[j - 2] + 1);
      }
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[n];
}

std::optional<std::string_view> closest_key(std::string_view key,
                                            std::span<const std::string_view> candidates) {
  if (key.empty()) return std::nullopt;
  const std::string k = lower(key);
  const std::size_t limit = std::max<std::size_t>(2, k.size() / 4);
  std::optional<std::string_view> best;
  std::size_t best_distance = limit + 1;
  for (std::string_view c : candidates) {
    // A key far longer than every candidate cannot be within the limit; skip
    // the quadratic work.
    std::size_t len_gap = c.size() > k.size() ? c.size() - k.size() : k.size() - c.size();
    if (len_gap > limit) continue;
    std::size_t d = edit_distance(k, lower(c));
    if (d < best_distance && d < k.size()) {
      best = c;
      best_distance = d;
    }
  }
  if (best) return best;
  // "micro_batch_size" for "train_micro_batch_size_per_gpu": not a typo but
  // a part of the name.
  if (k.size() >= 4) {
    for (std::string_view c : candidates) {
      std::string lc = lower(c);
      if (lc.find(k) != std::string::npos) return c;
      if (lc.size() >= 4 && k.find(lc) != std::string::npos) return c;
    }
  }
  return std::nullopt;
}

}  // namespace zero::config
