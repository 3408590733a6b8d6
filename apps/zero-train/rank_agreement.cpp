#include "rank_agreement.h"

#include <array>

#include "zero/ckpt/crc32c.h"
#include "zero/core/error.h"

namespace zero::train {
namespace {

std::uint32_t crc_of(const std::string& s) { return ckpt::crc32c(0, s.data(), s.size()); }

}  // namespace

RunFingerprint fingerprint_run(const std::vector<std::string>& arguments, const std::string& resolved_config,
                               const std::vector<std::uint8_t>& train_bytes,
                               const std::vector<std::uint8_t>& validation_bytes) {
  std::string joined;
  for (const std::string& a : arguments) {
    joined += a;
    joined += '\0';  // ("a b" is not "a" "b")
  }
  RunFingerprint f;
  f.arguments = crc_of(joined);
  f.config = crc_of(resolved_config);
  f.corpus = ckpt::crc32c(ckpt::crc32c(0, train_bytes.data(), train_bytes.size()), validation_bytes.data(),
                          validation_bytes.size());
  return f;
}

std::string first_disagreement(const std::vector<RunFingerprint>& by_rank) {
  for (std::size_t r = 1; r < by_rank.size(); ++r) {
    const RunFingerprint& a = by_rank[0];
    const RunFingerprint& b = by_rank[r];
    const std::string rank = "rank " + std::to_string(r);
    if (a.arguments != b.arguments) {
      return rank + " was started with other zero-train options than rank 0: every rank must run the same "
                    "command (one mpirun line, no per-rank options)";
    }
    if (a.config != b.config) {
      return rank + " resolved another config than rank 0 (the --config file differs between their nodes): "
                    "give every node the same file";
    }
    if (a.corpus != b.corpus) {
      return rank + " read another corpus than rank 0 (its bytes differ: the data path holds other files on "
                    "its node): give every rank the same corpus";
    }
  }
  return "";
}

void check_ranks_agree(comm::Communicator& comm, const RunFingerprint& mine) {
  const int world = comm.world_size();
  if (world == 1) return;
  // Each CRC as two 16-bit halves, exact in fp32 (the collectives carry floats).
  auto halves = [](std::uint32_t v, float* out) {
    out[0] = static_cast<float>(v >> 16);
    out[1] = static_cast<float>(v & 0xffffu);
  };
  std::array<float, 6> send{};
  halves(mine.arguments, &send[0]);
  halves(mine.config, &send[2]);
  halves(mine.corpus, &send[4]);
  std::vector<float> all(6 * static_cast<std::size_t>(world));
  comm.all_gather(send.data(), all.data(), send.size(), DType::kFloat32)->wait();
  auto whole = [&](std::size_t at) {
    return (static_cast<std::uint32_t>(all[at]) << 16) | static_cast<std::uint32_t>(all[at + 1]);
  };
  std::vector<RunFingerprint> by_rank(static_cast<std::size_t>(world));
  for (std::size_t r = 0; r < by_rank.size(); ++r) {
    by_rank[r] = {whole(6 * r), whole(6 * r + 2), whole(6 * r + 4)};
  }
  const std::string differs = first_disagreement(by_rank);
  ZERO_CHECK(differs.empty(), differs);
}

}  // namespace zero::train
