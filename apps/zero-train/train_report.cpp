#include "train_report.h"

#include "zero/core/error.h"

namespace zero::train {

std::vector<std::vector<std::int64_t>> gather_int64(comm::Communicator& comm,
                                                    const std::vector<std::int64_t>& mine) {
  const std::size_t n = mine.size(), world = static_cast<std::size_t>(comm.world_size());
  std::vector<float> send(3 * n), recv(3 * n * world);
  for (std::size_t i = 0; i < n; ++i) {
    ZERO_INTERNAL_ASSERT(mine[i] >= 0 && mine[i] < (std::int64_t{1} << 48));
    const auto v = static_cast<std::uint64_t>(mine[i]);
    send[3 * i] = static_cast<float>(v >> 32);
    send[3 * i + 1] = static_cast<float>((v >> 16) & 0xffff);
    send[3 * i + 2] = static_cast<float>(v & 0xffff);
  }
  comm.all_gather(send.data(), recv.data(), 3 * n, DType::kFloat32)->wait();
  std::vector<std::vector<std::int64_t>> out(world, std::vector<std::int64_t>(n));
  for (std::size_t r = 0; r < world; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      const float* f = &recv[r * 3 * n + 3 * i];
      out[r][i] = (static_cast<std::int64_t>(f[0]) << 32) | (static_cast<std::int64_t>(f[1]) << 16) |
                  static_cast<std::int64_t>(f[2]);
    }
  }
  return out;
}

std::vector<std::int64_t> flatten_ledger(const memory::LedgerSnapshot& s) {
  std::vector<std::int64_t> v;
  for (int t = 0; t < memory::kNumTiers; ++t)
    for (int k = 0; k < memory::kNumKinds; ++k) v.push_back(s.current[t][k]);
  for (int t = 0; t < memory::kNumTiers; ++t)
    for (int k = 0; k < memory::kNumKinds; ++k) v.push_back(s.peak[t][k]);
  for (int t = 0; t < memory::kNumTiers; ++t) v.push_back(s.tier_peak[t]);
  return v;
}

nlohmann::json ledger_json(const std::vector<std::int64_t>& flat) {
  nlohmann::json j;
  const int tk = memory::kNumTiers * memory::kNumKinds;
  for (int t = 0; t < memory::kNumTiers; ++t) {
    const std::string tier(memory::tier_name(static_cast<memory::Tier>(t)));
    std::int64_t total = 0;
    for (int k = 0; k < memory::kNumKinds; ++k) {
      const std::string kind(memory::kind_name(static_cast<memory::Kind>(k)));
      j[tier]["final"][kind] = flat[t * memory::kNumKinds + k];
      j[tier]["peak"][kind] = flat[tk + t * memory::kNumKinds + k];
      total += flat[t * memory::kNumKinds + k];
    }
    j[tier]["final_total"] = total;
    j[tier]["peak_total"] = flat[2 * tk + t];
    std::int64_t model_states = 0;
    for (auto k : {memory::Kind::kHalfParams, memory::Kind::kGrads, memory::Kind::kFp32Master, memory::Kind::kMoments})
      model_states += flat[t * memory::kNumKinds + static_cast<int>(k)];
    j[tier]["model_states"] = model_states;
  }
  return j;
}

nlohmann::json comm_json(const comm::CommStats& c) {
  nlohmann::json j;
  for (std::size_t i = 0; i < comm::kNumCollectiveKinds; ++i) {
    const std::string name(comm::collective_name(static_cast<comm::CollectiveKind>(i)));
    j[name] = {{"bytes", c.bytes_sent[i]}, {"calls", c.calls[i]}};
  }
  j["total_bytes"] = c.total_bytes();
  return j;
}

std::vector<std::int64_t> flatten_comm(const comm::CommStats& c) {
  std::vector<std::int64_t> v;
  for (auto b : c.bytes_sent) v.push_back(static_cast<std::int64_t>(b));
  for (auto n : c.calls) v.push_back(static_cast<std::int64_t>(n));
  return v;
}

comm::CommStats unflatten_comm(const std::vector<std::int64_t>& flat) {
  ZERO_INTERNAL_ASSERT(flat.size() == 2 * comm::kNumCollectiveKinds);
  comm::CommStats c;
  for (std::size_t i = 0; i < comm::kNumCollectiveKinds; ++i) {
    c.bytes_sent[i] = static_cast<std::uint64_t>(flat[i]);
    c.calls[i] = static_cast<std::uint64_t>(flat[comm::kNumCollectiveKinds + i]);
  }
  return c;
}

nlohmann::json comm_bytes_json(const comm::CommStats& c) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t i = 0; i < comm::kNumCollectiveKinds; ++i) {
    if (c.calls[i] == 0) continue;
    j[std::string(comm::collective_name(static_cast<comm::CollectiveKind>(i)))] = c.bytes_sent[i];
  }
  return j;
}

void add_comm(comm::CommStats& sum, const comm::CommStats& step) {
  for (std::size_t i = 0; i < comm::kNumCollectiveKinds; ++i) {
    sum.bytes_sent[i] += step.bytes_sent[i];
    sum.calls[i] += step.calls[i];
  }
}

}  // namespace zero::train
