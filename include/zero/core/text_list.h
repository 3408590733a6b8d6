// A list said in one message: "a, b, c, ... (7 in all)", the first `shown`
// items joined by `sep`, then how many there are when some were left out.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zero::detail {

inline std::string join_first(const std::vector<std::string>& items, std::size_t shown,
                              const std::string& sep = ", ") {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < shown; ++i) out += (i ? sep : "") + items[i];
  if (items.size() > shown) out += sep + "... (" + std::to_string(items.size()) + " in all)";
  return out;
}

}  // namespace zero::detail
