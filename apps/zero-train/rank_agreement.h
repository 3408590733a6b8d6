// Every rank of a zero-train job must run the same training: the same
// command line, the same config and the same corpus bytes. A launch that
// breaks this (an MPMD line with other options per rank, a config or corpus
// that differs between nodes) would otherwise issue different collectives
// on different ranks, which MPI does not diagnose: a crash inside MPI, a
// hang, or ranks that silently train on different data. The ranks agree on
// a fingerprint of each before the model is built, and a difference is one
// error that names the rank and what differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/comm/communicator.h"

namespace zero::train {

struct RunFingerprint {
  std::uint32_t arguments = 0;  // the command line after the program's name
  std::uint32_t config = 0;     // the resolved config
  std::uint32_t corpus = 0;     // the training and validation bytes
};

// CRC-32Cs of each part.
RunFingerprint fingerprint_run(const std::vector<std::string>& arguments, const std::string& resolved_config,
                               const std::vector<std::uint8_t>& train_bytes,
                               const std::vector<std::uint8_t>& validation_bytes);

// The first rank whose fingerprint differs from rank 0's, and in what
// ("" where all agree): pure, for tests.
std::string first_disagreement(const std::vector<RunFingerprint>& by_rank);

// Collective: every rank gathers every fingerprint; a difference throws the
// same zero::Error on every rank.
void check_ranks_agree(comm::Communicator& comm, const RunFingerprint& mine);

}  // namespace zero::train
