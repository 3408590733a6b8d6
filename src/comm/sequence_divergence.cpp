#include "zero/comm/sequence_divergence.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <sstream>
#include <utility>

namespace zero::comm {
namespace {

std::uint64_t first_kept(const FlightRecord& rec) {
  return rec.records.empty() ? rec.issued : rec.records.front().seq;
}

// The op numbers to compare: from the newest first kept record of any rank
// (every rank still records those it issued) to the most any rank issued.
std::pair<std::uint64_t, std::uint64_t> compared_ops(const std::vector<FlightRecord>& per_rank) {
  std::uint64_t start = 0, end = 0;
  for (const FlightRecord& r : per_rank) {
    start = std::max(start, first_kept(r));
    end = std::max(end, r.issued);
  }
  return {start, end};
}

// The ranks grouped by what they issued as op `seq` ("" if they all issued
// the same, or, with issuers_must_differ, if those that issued it did).
std::string describe_groups(const std::vector<FlightRecord>& per_rank, std::uint64_t seq,
                            bool issuers_must_differ) {
  // Groups of ranks by what they issued as op `seq`; a rank that has not
  // issued it is its own kind of group.
  struct Group {
    const OpRecord* op;
    std::vector<int> ranks;
  };
  std::vector<Group> groups;
  int issued_kinds = 0;
  for (std::size_t q = 0; q < per_rank.size(); ++q) {
    const OpRecord* op = per_rank[q].find(seq);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
      return (x.op == nullptr) == (op == nullptr) && (op == nullptr || x.op->sig == op->sig);
    });
    if (g == groups.end()) {
      groups.push_back({op, {static_cast<int>(q)}});
      if (op != nullptr) ++issued_kinds;
    } else {
      g->ranks.push_back(static_cast<int>(q));
    }
  }
  if (groups.size() == 1 || (issuers_must_differ && issued_kinds < 2)) return {};
  if (issuers_must_differ) {
    // Where the others have got to changes while they are asked: leave them
    // out (the ranks on each side may still differ from rank to rank: see
    // IssuedDivergence::key).
    groups.erase(std::remove_if(groups.begin(), groups.end(), [](const Group& g) { return g.op == nullptr; }),
                 groups.end());
  }
  std::sort(groups.begin(), groups.end(),
            [](const Group& a, const Group& b) { return a.ranks.front() < b.ranks.front(); });
  std::ostringstream os;
  os << "the ranks' collective sequences diverge at op #" << seq << ":";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    os << (i == 0 ? " " : "; ") << format_ranks(groups[i].ranks);
    if (groups[i].op != nullptr) {
      os << " issued " << describe(groups[i].op->sig);
    } else {
      os << (groups[i].ranks.size() == 1 ? " has" : " have") << " not issued it";
      // Say how far each of these ranks got.
      if (groups[i].ranks.size() == 1) {
        os << " (" << per_rank[groups[i].ranks[0]].issued << " ops issued)";
      }
    }
  }
  return os.str();
}

}  // namespace

std::string format_ranks(const std::vector<int>& ranks) {
  std::vector<int> r = ranks;
  std::sort(r.begin(), r.end());
  std::ostringstream os;
  os << (r.size() == 1 ? "rank " : "ranks ");
  for (std::size_t i = 0; i < r.size();) {
    std::size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (i > 0) os << ", ";
    if (j >= i + 2) {
      os << r[i] << "-" << r[j];
    } else {
      os << r[i];
      if (j == i + 1) os << ", " << r[j];
    }
    i = j + 1;
  }
  return os.str();
}

std::string find_divergence(const std::vector<FlightRecord>& per_rank) {
  if (per_rank.size() < 2) return {};
  const bool same = std::all_of(per_rank.begin(), per_rank.end(), [&](const FlightRecord& r) {
    return r.issued == per_rank[0].issued && r.hash == per_rank[0].hash;
  });
  if (same) return {};

  const auto [start, end] = compared_ops(per_rank);
  for (std::uint64_t seq = start; seq < end; ++seq) {
    std::string d = describe_groups(per_rank, seq, /*issuers_must_differ=*/false);
    if (!d.empty()) return d;
  }
  std::ostringstream os;
  os << "the ranks' collective sequences differ (op counts or hashes), but not in the ops every "
        "rank still records (from op #"
     << start << "): they diverged earlier; raise flight_recorder.entries to see where";
  return os.str();
}

IssuedDivergence find_issued_divergence(const std::vector<FlightRecord>& per_rank) {
  if (per_rank.size() < 2) return {};
  const auto [start, end] = compared_ops(per_rank);
  for (std::uint64_t seq = start; seq < end; ++seq) {
    std::string d = describe_groups(per_rank, seq, /*issuers_must_differ=*/true);
    if (d.empty()) continue;
    std::set<std::string> sigs;
    for (const FlightRecord& r : per_rank) {
      if (const OpRecord* op = r.find(seq)) sigs.insert(describe(op->sig));
    }
    std::string key = "op #" + std::to_string(seq) + ":";
    for (const std::string& sig : sigs) key += " [" + sig + "]";
    return {std::move(d), std::move(key)};
  }
  return {};
}

}  // namespace zero::comm
