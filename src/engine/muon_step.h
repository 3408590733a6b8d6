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
// otherwise). The orthogonalization needs the whole of v: a matrix that
// lies across chunks (stages 1-3, several ranks) has the parts it lacks
// all-gathered from the ends of the other ranks' chunks, in fp32, in windows
// of at most kGatherWindowBytes (DeepSpeed gathers Muon's matrices 64 MiB at
// a time too); zero/zero/muon_plan.h says which, and what that holds in
// memory. Each rank then orthogonalizes the matrices it holds a part of, one
// at a time, on the compute device, and writes its part of u where v was;
// the optimizer's step then applies p <- p*(1 - lr*wd) - lr*u there
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
#include "zero/zero/muon_plan.h"

namespace zero::detail {

class MuonStep {
 public:
  struct Matrix {
    int param;                        // in the layout
    std::vector<std::int64_t> shape;  // two dimensions or more (muon_update_direction)
  };
  static constexpr std::size_t kGatherWindowBytes = kMuonGatherWindowBytes;

  // `compute`: where v is gathered and orthogonalized (the engine's device).
  // window_bytes: the most one all-gather receives (kGatherWindowBytes;
  // tests make it small: ZERO_TEST_MUON_GATHER_WINDOW_BYTES, read by
  // test_window_bytes()).
  MuonStep(const FlatLayout& layout, int shard_rank, std::vector<Matrix> matrices, float momentum, NsMethod method,
           c10::Device compute, std::size_t window_bytes = kGatherWindowBytes);
  static std::size_t test_window_bytes();

  // The most fp32 elements prepare() holds at once on the compute device
  // (zero::muon_work_elements, which the memory plan counts too).
  std::size_t work_elements() const;

  // chunk_grads(b): this rank's gradients of bucket b's chunk (b.chunk
  // elements, any floating dtype, still to be multiplied by grad_scale);
  // momentum and update: the partition's exp_avg and exp_avg_sq (fp32;
  // where the optimizer state is: host memory with offload).
  using ChunkGradsFn = std::function<at::Tensor(const Bucket&)>;
  void prepare(const ChunkGradsFn& chunk_grads, const at::Tensor& momentum, const at::Tensor& update,
               float grad_scale, comm::Communicator& comm) const;

 private:
  const FlatLayout& layout_;
  int shard_rank_;
  std::vector<Matrix> matrices_;
  std::vector<MuonMatrix> views_;  // matrices_ as they are orthogonalized
  float momentum_;
  NsMethod method_;
  c10::Device compute_;
  std::size_t window_bytes_;
  std::vector<MuonBucketPlan> plan_;
};

}  // namespace zero::detail
