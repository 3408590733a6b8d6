// Where Muon's whole matrices come from, bucket by bucket, for one rank, and
// the memory that costs (no LibTorch here: the engine's MuonStep follows
// this plan, and the memory plan counts it).
//
// Muon orthogonalizes each of its matrices whole, but under ZeRO a rank
// holds only its chunk of every bucket. A matrix wholly inside the rank's
// chunk is *local*: it is orthogonalized from the rank's own values. A
// matrix that lies across chunks is *shared*: each rank that holds a part
// of it needs the rest. Those parts lie at the ends of the chunks: in chunk
// q, a shared matrix that began in an earlier chunk fills a head
// [0, head_q), and one that goes on into a later chunk fills a tail
// [chunk - tail_q, chunk). Every rank all-gathers [0, H) and
// [chunk - T, chunk) of its chunk, with H and T the largest head and tail of
// the bucket, which every rank computes alike from the layout: the
// communication of the straddling matrices, not of the bucket.
//
// Memory, on the device Muon computes on, in fp32: the shared matrices of a
// bucket held whole while they are gathered (with the send and receive
// windows), then orthogonalized one at a time, each freed after; then the
// local ones, one at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "zero/zero/flat_layout.h"

namespace zero {

// The most one of Muon's all-gathers receives (DeepSpeed gathers its
// matrices 64 MiB at a time too).
inline constexpr std::size_t kMuonGatherWindowBytes = std::size_t{64} << 20;

// A parameter that Muon steps, as it is orthogonalized: `batch` matrices of
// rows x cols (2-D: one; 3-D and 5-D or more: a batch of the last two
// dimensions; 4-D, a convolution's filters: [size(0), the rest]).
struct MuonMatrix {
  int param = 0;  // in the layout
  std::int64_t batch = 1, rows = 0, cols = 0;
  std::size_t numel() const { return static_cast<std::size_t>(batch * rows * cols); }
};
MuonMatrix muon_matrix(int param, const std::vector<std::int64_t>& shape);

// Elements of a matrix in one rank's chunk.
struct MuonPart {
  std::size_t matrix = 0;    // in the matrices given to plan_muon
  std::size_t in_param = 0;  // the part's first element, within the parameter
  std::size_t in_chunk = 0;  // ... within the chunk
  std::size_t n = 0;
};

struct MuonBucketPlan {
  int bucket = 0;
  // Every rank all-gathers [0, head) and [chunk - tail, chunk) of its chunk
  // (both 0: the bucket has no shared matrix, nothing is gathered).
  std::size_t head = 0, tail = 0;
  std::vector<std::size_t> shared;  // across chunks, with a part in this rank's chunk
  std::vector<std::size_t> local;   // wholly in this rank's chunk
  std::vector<MuonPart> parts;      // this rank's parts of both
  bool gathers() const { return head + tail > 0; }
  // The chunk ranges [begin, end) that are gathered: one where head and
  // tail meet.
  std::vector<std::pair<std::size_t, std::size_t>> gather_ranges(std::size_t chunk) const;
};

// The buckets holding a Muon matrix (of at least one element), in bucket
// order: every rank gets the same buckets with the same head and tail (its
// collectives match).
std::vector<MuonBucketPlan> plan_muon(const FlatLayout& layout, int shard_rank,
                                      const std::vector<MuonMatrix>& matrices);

// The elements of one gather window per rank: window_bytes in fp32 over
// the ranks (at least 1), no more than the longest gathered range.
std::size_t muon_window_elements(const MuonBucketPlan& b, std::size_t chunk, int world, std::size_t window_bytes);

// fp32 elements the orthogonalization of `m` allocates beside its input at
// its peak (muon_update_direction, src/engine/muon_update.cpp, measured by
// muon_test): with X the matrix's elements and S = batch * n * n (n =
// min(rows, cols)) those of its Gram products, 3X + 2S for the standard
// iteration (the normalized copy, the next iterate and the scaled result;
// two n x n products), and for Gram's on a matrix that is not square the
// larger of that and 2X + 5S (its polynomial Q and R's products).
std::size_t muon_ns_workspace_elements(const MuonMatrix& m, bool gram);

// The most fp32 elements alive at once on the compute device in one Muon
// step of this rank (MuonStep::prepare), at its bound.
// gram: ns_method "gram" (else "standard").
std::size_t muon_work_elements(const FlatLayout& layout, const std::vector<MuonBucketPlan>& plan,
                               const std::vector<MuonMatrix>& matrices, std::size_t window_bytes, bool gram);

}  // namespace zero
