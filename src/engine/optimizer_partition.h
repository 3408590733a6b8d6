// The optimizer's state for this rank's partition: the fp32 master weights
// and the moments (on the device, or on the host with offload), the staging
// buffer the CPU step writes the updated training-precision parameters to,
// the CPU thread pool, and the step itself: the CPU Adam/Adagrad kernels on
// host memory, the registered device Adam (zero/optim/device_adam_registry.h)
// on a GPU. No collectives in here: the DPU worker runs step().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>

#include "device_context.h"
#include "zero/config/config.h"
#include "zero/memory/memory_ledger.h"
#include "zero/optim/device_adam_registry.h"
#include "zero/optim/thread_pool.h"
#include "zero/zero/flat_layout.h"
#include "zero/zero/memory_plan.h"

namespace zero::detail {

class OptimizerPartition {
 public:
  struct Options {
    bool offload = false;         // state in host memory, the CPU kernels
    c10::ScalarType dtype = c10::ScalarType::Float;  // the training precision
  };
  // Throws before allocating when the device has no kernel for the optimizer.
  OptimizerPartition(const config::Config& config, const MemoryPlan& plan, const DeviceContext& ctx,
                     Options options, memory::MemoryLedger& ledger);

  // The master partition from the rank's chunks of `flat32` (the full fp32
  // parameters).
  void seed_master(const at::Tensor& flat32);
  // The same bucket by bucket (stage 3 never holds the full parameters):
  // allocate, then each bucket's chunk (fp32, b.chunk elements) once.
  void allocate_master();
  void seed_master_chunk(const Bucket& b, const at::Tensor& chunk32);
  // The moments (zeros; Adagrad: its initial accumulator). Allocated after
  // the caller has freed its construction temporaries.
  void allocate_moments();

  // The step goes through the partition in pieces, bucket by bucket in the
  // layout's order, so that each finished piece can be copied up while the
  // next ones are stepped: about an eighth of a bucket's chunk (the copy of
  // the last piece is what the next forward waits for), at most
  // kMaxPieceElements, in multiples of kPieceAlign elements. Each piece is a
  // whole dispatch of the thread pool: pieces of 16M elements made the CPU
  // Adam of a 1.2B model ~20% slower beside a GPU than pieces of 60M
  // (docs/PERFORMANCE.md).
  static constexpr std::size_t kMaxPieceElements = std::size_t{1} << 26;
  static constexpr std::size_t kPieceAlign = 64;
  struct Piece {
    const Bucket* bucket;
    std::size_t offset;  // within the bucket's chunk
    std::size_t n;
    std::size_t index;   // in pieces()
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

  // One step of this rank's partition. grads(b): bucket b's gradient chunk;
  // half_out(b, grad): where the updated training-precision chunk of bucket
  // b goes (nullptr: nowhere, as in fp32); after_piece (optional): a piece
  // is done, its half_out written.
  using GradsFn = std::function<at::Tensor(const Bucket&)>;
  using HalfOutFn = std::function<void*(const Bucket&, const at::Tensor& grad)>;
  using PieceDoneFn = std::function<void(const Piece&)>;
  void step(const GradsFn& grads, const HalfOutFn& half_out, float grad_scale, float lr, std::int64_t step,
            const PieceDoneFn& after_piece = {});

  // The rank's partition, fp32.
  const at::Tensor& master() const { return master_; }
  // The updated training-precision partition (offload with staging).
  const at::Tensor& staging() const { return staging_; }
  // The moments, fp32, the partition's size (Adam: m and v; Adagrad: the
  // sum in exp_avg, exp_avg_sq undefined).
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  int moments() const { return adagrad_ ? 1 : 2; }

 private:
  at::Tensor allocate(Buffer id, c10::ScalarType dtype, bool zero);

  const config::OptimizerConfig& opt_;
  const MemoryPlan& plan_;
  const FlatLayout& layout_;
  const DeviceContext& ctx_;
  Options o_;
  memory::MemoryLedger& ledger_;
  bool adagrad_ = false;
  optim::DeviceAdamFn device_adam_ = nullptr;
  at::Tensor master_, exp_avg_, exp_avg_sq_, staging_;
  std::unique_ptr<optim::ThreadPool> pool_;
  std::vector<Piece> pieces_;
  std::vector<memory::MemoryLedger::Registration> regs_;
};

}  // namespace zero::detail
