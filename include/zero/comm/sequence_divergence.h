// Where the collective sequences of several ranks part: the sequence check's
// diagnosis. Pure functions of the ranks' flight records, so that they are
// tested without a job.
#pragma once

#include <string>
#include <vector>

#include "zero/comm/flight_recorder.h"

namespace zero::comm {

// per_rank[r] is rank r's record. Returns "" when every rank issued the same
// ops (same count and hash). Otherwise a sentence naming the first op where
// the ranks differ and what each group of ranks issued there, e.g.
//   "the ranks' collective sequences diverge at op #57: ranks 0, 1, 3 issued
//    all_reduce sum fp32 x 4; rank 2 issued all_reduce max fp32 x 4"
// or, if the difference is older than every rank still records, a sentence
// that says so.
std::string find_divergence(const std::vector<FlightRecord>& per_rank);

// For ranks caught at different points of a correct sequence (a timeout, a
// failed op): the first op, among those every rank still records, that two
// ranks issued differently (a rank that has not issued it yet does not
// count). `text` describes it as find_divergence does, naming the ranks of
// each side ("" if there is none); `key` names only the op's number and the
// signatures issued as it, which every rank finds alike even where it asked
// before a slow rank issued the op.
struct IssuedDivergence {
  std::string text;
  std::string key;
};
IssuedDivergence find_issued_divergence(const std::vector<FlightRecord>& per_rank);

// "rank 3", "ranks 0, 1, 3", "ranks 0-5, 7".
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace zero::comm
