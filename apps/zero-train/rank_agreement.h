// Every rank of a zero-train job must run the same training: the same
// options, the same config and the same corpus bytes. A launch that breaks
// this (an MPMD line with other options per rank, a config or corpus that
// differs between nodes) would otherwise issue different collectives on
// different ranks, which MPI does not diagnose: a crash inside MPI, a hang,
// or ranks that silently train on different data. The ranks agree on a
// fingerprint of each before the model is built, and a difference is one
// error that names the rank and what differs. Paths that may differ per
// node without changing the training (--out, --report, the corpus's own
// path: its bytes are compared) are not part of it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zero/comm/communicator.h"

namespace zero::train {

// One part of the run: its name ("--steps", "config", "corpus") and the
// CRC-32C of its value. Every rank lists the same names in the same order.
struct RunPart {
  std::string name;
  std::uint32_t crc = 0;
};

// options: (flag, value) of each option that shapes the training.
std::vector<RunPart> fingerprint_run(const std::vector<std::pair<std::string, std::string>>& options,
                                     const std::string& resolved_config, const std::vector<std::uint8_t>& train_bytes,
                                     const std::vector<std::uint8_t>& validation_bytes);

// The first rank whose parts differ from rank 0's, and in what ("" where
// all agree): crcs[r][i] is rank r's CRC of names[i].
std::string first_disagreement(const std::vector<std::string>& names,
                               const std::vector<std::vector<std::uint32_t>>& crcs);

// Collective: every rank gathers every fingerprint; a difference throws the
// same zero::Error on every rank.
void check_ranks_agree(comm::Communicator& comm, const std::vector<RunPart>& mine);

}  // namespace zero::train
