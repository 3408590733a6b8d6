// The part of a Muon step that needs whole matrices (DeepSpeed's
// MuonWithAuxAdam under ZeRO): before the optimizer steps the partition,
// for each matrix that EngineOptions::use_muon gave to Muon,
//
//   m ← m + (1 − μ)·(g − m)          (the momentum, in exp_avg's place)
//   v = g + μ·(m − g)                  (Nesterov's look-ahead, DeepSpeed's)
//   u = muon_orthogonalize(v)          (muon_update.h)
//
// with g the rank's reduced, unscaled and clipped gradient. The momentum and
// v are elementwise, so each rank computes them on its own chunk of each
// bucket, into exp_avg_sq's place (which Muon's matrices do not use
// otherwise). The orthogonalization needs the whole of v, so a bucket with
// a matrix split across chunks (stages 1-3, several ranks) is all-gathered
// first, in fp32, in windows of at most kGatherWindowBytes (DeepSpeed
// gathers Muon's matrices 64 MiB at a time too): the communication of one
// more all-gather of those buckets per step; in memory, the window and the
// matrices the rank holds a part of, whole. Each rank then orthogonalizes
// those on the compute device and writes its part of u where v was; the
// optimizer's step then applies p ← p·(1 − lr·wd) − lr·u there
// (optimizer_partition.cpp).
//
// Collective: every rank calls prepare() at each step that is taken, on the
// main thread (not the delayed update's worker).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "muon_update.h"
#include "zero/comm/communicator.h"
#include "zero/zero/flat_layout.h"

namespace zero::detail {

class MuonStep {
 public:
  struct Matrix {
    int param;                        // in the layout
    std::vector<std::int64_t> shape;  // two dimensions or more (muon_update_direction)
  };
  // The most one all-gather of v receives.
  static constexpr std::size_t kGatherWindowBytes = std::size_t{64} << 20;

  // `compute`: where v is gathered and orthogonalized (the engine's device).
  // window_bytes: the most one all-gather receives (kGatherWindowBytes;
  // tests make it small: ZERO_TEST_MUON_GATHER_WINDOW_BYTES, read by
  // test_window_bytes()).
  MuonStep(const FlatLayout& layout, int shard_rank, std::vector<Matrix> matrices, float momentum, NsMethod method,
           c10::Device compute, std::size_t window_bytes = kGatherWindowBytes);
  static std::size_t test_window_bytes();

  // chunk_grads(b): this rank's gradients of bucket b's chunk (b.chunk
  // elements, any floating dtype, still to be multiplied by grad_scale);
  // momentum and update: the partition's exp_avg and exp_avg_sq (fp32;
  // where the optimizer state is: host memory with offload).
  using ChunkGradsFn = std::function<at::Tensor(const Bucket&)>;
  void prepare(const ChunkGradsFn& chunk_grads, const at::Tensor& momentum, const at::Tensor& update,
               float grad_scale, comm::Communicator& comm) const;

 private:
  // The elements of bucket `bucket`'s matrices in this rank's chunk.
  struct Part {
    std::size_t matrix;        // in matrices_
    std::size_t in_param;      // the part's first element, within the parameter
    std::size_t in_chunk;      // ... within the chunk
    std::size_t n;
  };
  struct BucketWork {
    int bucket;
    bool gather;               // a matrix of it lies across chunks
    std::vector<Part> parts;   // this rank's
    std::vector<std::size_t> whole;  // the matrices of which this rank holds a part
  };
  const FlatLayout& layout_;
  int shard_rank_;
  std::vector<Matrix> matrices_;
  float momentum_;
  NsMethod method_;
  c10::Device compute_;
  std::size_t window_bytes_;
  std::vector<BucketWork> work_;
};

}  // namespace zero::detail
