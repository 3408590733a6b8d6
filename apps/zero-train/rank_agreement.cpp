#include "rank_agreement.h"

#include "zero/ckpt/crc32c.h"
#include "zero/core/error.h"

namespace zero::train {

std::vector<RunPart> fingerprint_run(const std::vector<std::pair<std::string, std::string>>& options,
                                     const std::string& resolved_config, const std::vector<std::uint8_t>& train_bytes,
                                     const std::vector<std::uint8_t>& validation_bytes) {
  std::vector<RunPart> parts;
  for (const auto& [flag, value] : options) parts.push_back({flag, ckpt::crc32c(0, value.data(), value.size())});
  parts.push_back({"config", ckpt::crc32c(0, resolved_config.data(), resolved_config.size())});
  parts.push_back({"corpus", ckpt::crc32c(ckpt::crc32c(0, train_bytes.data(), train_bytes.size()),
                                          validation_bytes.data(), validation_bytes.size())});
  return parts;
}

std::string first_disagreement(const std::vector<std::string>& names,
                               const std::vector<std::vector<std::uint32_t>>& crcs) {
  for (std::size_t r = 1; r < crcs.size(); ++r) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (crcs[r][i] == crcs[0][i]) continue;
      const std::string ranks = "rank " + std::to_string(r) + " and rank 0";
      if (names[i] == "config") {
        return ranks + " resolved different configs (the --config file differs between their nodes): give every "
                       "node the same file";
      }
      if (names[i] == "corpus") {
        return ranks + " read different corpus bytes (the data path holds other files on one of their nodes): "
                       "give every rank the same corpus";
      }
      return ranks + " were started with different " + names[i] + " values: every rank must run the same "
                     "command (one mpirun line, no per-rank options)";
    }
  }
  return "";
}

void check_ranks_agree(comm::Communicator& comm, const std::vector<RunPart>& mine) {
  const auto world = static_cast<std::size_t>(comm.world_size());
  if (world == 1) return;
  // Each CRC as two 16-bit halves, exact in fp32 (the collectives carry floats).
  const std::size_t n = mine.size();
  std::vector<float> send(2 * n), all(2 * n * world);
  for (std::size_t i = 0; i < n; ++i) {
    send[2 * i] = static_cast<float>(mine[i].crc >> 16);
    send[2 * i + 1] = static_cast<float>(mine[i].crc & 0xffffu);
  }
  comm.all_gather(send.data(), all.data(), send.size(), DType::kFloat32)->wait();
  std::vector<std::string> names;
  for (const RunPart& p : mine) names.push_back(p.name);
  std::vector<std::vector<std::uint32_t>> crcs(world, std::vector<std::uint32_t>(n));
  for (std::size_t r = 0; r < world; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      const float* at = &all[2 * (r * n + i)];
      crcs[r][i] = (static_cast<std::uint32_t>(at[0]) << 16) | static_cast<std::uint32_t>(at[1]);
    }
  }
  const std::string differs = first_disagreement(names, crcs);
  ZERO_CHECK(differs.empty(), differs);
}

}  // namespace zero::train
