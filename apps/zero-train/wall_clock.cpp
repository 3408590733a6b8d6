#include "wall_clock.h"

#include <cstdio>
#include <utility>

namespace zero::train {

std::string wall_clock_breakdown(const std::vector<TimelineInterval>& intervals, std::int64_t steps) {
  std::vector<std::pair<std::string, double>> sums;  // in the order first seen
  for (const TimelineInterval& t : intervals) {
    const std::string name = t.lane == "compute" ? t.what : t.lane;
    auto it = sums.begin();
    while (it != sums.end() && it->first != name) ++it;
    if (it == sums.end()) it = sums.insert(sums.end(), {name, 0.0});
    it->second += t.end_ms - t.start_ms;
  }
  std::string out;
  char buf[96];
  for (const auto& [name, ms] : sums) {
    std::snprintf(buf, sizeof buf, "%s%s %.1f ms", out.empty() ? "" : ", ", name.c_str(),
                  ms / static_cast<double>(steps > 0 ? steps : 1));
    out += buf;
  }
  return out.empty() ? "nothing recorded" : out;
}

}  // namespace zero::train
