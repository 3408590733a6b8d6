#include "out_of_memory.h"

#include <new>
#include <regex>
#include <sstream>
#include <string>

#include <c10/util/Exception.h>

#include "zero/core/error.h"
#include "zero/core/pinned_host_allocator.h"

namespace zero::detail {
namespace {

// "you tried to allocate 67108864 bytes" (CPU allocator), "Tried to allocate
// 2.00 GiB" (CUDA caching allocator).
std::string asked_for(const std::string& what) {
  static const std::regex pattern("[Tt]ried to allocate ([0-9.]+ ?[A-Za-z]*)");
  std::smatch m;
  if (std::regex_search(what, m, pattern)) return m[1].str();
  return "";
}

}  // namespace

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  if (dynamic_cast<const zero::Error*>(&e) != nullptr) return false;  // ours already say what they need
  const std::string what = e.what();
  return what.find("not enough memory") != std::string::npos ||
         what.find("can't allocate memory") != std::string::npos ||
         what.find("out of memory") != std::string::npos;
}

void rethrow_if_out_of_memory(const std::exception& e, std::string_view during,
                              const memory::MemoryLedger& ledger, std::string_view hint) {
  if (!is_out_of_memory(e)) return;
  const std::string what = e.what();
  const bool pinned = dynamic_cast<const PinnedHostOutOfMemory*>(&e) != nullptr;
  const bool device = !pinned && (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
                                  what.find("CUDA") != std::string::npos);
  const memory::LedgerSnapshot s = ledger.snapshot();
  std::ostringstream os;
  os << "out of " << (pinned ? "pinned host" : device ? "device" : "host") << " memory while " << during;
  const std::string asked = asked_for(what);
  os << ": an allocation of " << (asked.empty() ? std::string("unknown size") : asked) << " failed";
  os << "; zerocpp holds";
  bool any = false;
  for (int t = 0; t < memory::kNumTiers; ++t) {
    if (s.tier_current[t] == 0) continue;
    os << (any ? "," : "") << " " << memory::format_bytes(s.tier_current[t]) << " on the "
       << memory::tier_name(static_cast<memory::Tier>(t)) << " (";
    bool first = true;
    for (int k = 0; k < memory::kNumKinds; ++k) {
      if (s.current[t][k] == 0) continue;
      os << (first ? "" : ", ") << memory::kind_name(static_cast<memory::Kind>(k)) << " "
         << memory::format_bytes(s.current[t][k]);
      first = false;
    }
    os << ")";
    any = true;
  }
  if (!any) os << " nothing yet";
  if (pinned) {
    // The offload buffers on a GPU are page-locked: the kernel can neither
    // swap them nor overcommit them, and a container's memory limit counts them.
    os << ". Pinned memory is host memory that cannot be swapped: the offload buffers need it all at once, so "
          "the node's free memory (or the container's limit), not its total, is the bound. To need less: fewer "
          "ranks per node, a higher zero_optimization.stage or more nodes, offload_optimizer.ratio below 1 (a share "
          "of the optimizer state stays on the GPU), no delayed_param_update (its second gradient buffer). The "
          "allocator said: "
       << what;
    throw Error(os.str());
  }
  os << ". zero-estimate says what fits where; to need less: " << hint << (hint.empty() ? "" : ", ") << "a higher zero_optimization.stage or more ranks, "
        "offload_optimizer.device=\"cpu\" (device memory), smaller reduce_bucket_size, a smaller micro-batch, "
        "activation checkpointing. The allocator said: "
     << what.substr(0, what.find('\n'));
  throw Error(os.str());
}

}  // namespace zero::detail
