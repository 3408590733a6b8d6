#include "muon_step.h"

#include <algorithm>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

namespace zero::detail {
namespace {

std::int64_t i64(std::size_t v) { return static_cast<std::int64_t>(v); }

}  // namespace

MuonStep::MuonStep(const FlatLayout& layout, int shard_rank, std::vector<Matrix> matrices, float momentum,
                   NsMethod method, c10::Device compute)
    : layout_(layout),
      shard_rank_(shard_rank),
      matrices_(std::move(matrices)),
      momentum_(momentum),
      method_(method),
      compute_(compute) {
  std::vector<std::vector<std::size_t>> of_bucket(layout_.buckets().size());
  for (std::size_t i = 0; i < matrices_.size(); ++i) {
    of_bucket[static_cast<std::size_t>(layout_.params()[static_cast<std::size_t>(matrices_[i].param)].bucket)]
        .push_back(i);
  }
  for (std::size_t k = 0; k < of_bucket.size(); ++k) {
    if (of_bucket[k].empty()) continue;
    const Bucket& b = layout_.buckets()[k];
    BucketWork w{static_cast<int>(k), false, {}, {}};
    const std::size_t chunk_begin = b.offset + static_cast<std::size_t>(shard_rank_) * b.chunk;
    for (std::size_t mi : of_bucket[k]) {
      const ParamSlot& s = layout_.params()[static_cast<std::size_t>(matrices_[mi].param)];
      const std::size_t first = (s.offset - b.offset) / b.chunk, last = (s.offset + s.numel - 1 - b.offset) / b.chunk;
      if (first != last) w.gather = true;
      const std::size_t lo = std::max(s.offset, chunk_begin), hi = std::min(s.offset + s.numel, chunk_begin + b.chunk);
      if (lo >= hi) continue;
      w.parts.push_back(Part{mi, lo - s.offset, lo - chunk_begin, hi - lo});
      w.whole.push_back(mi);
    }
    work_.push_back(std::move(w));
  }
}

std::size_t MuonStep::gathered_buckets() const {
  return static_cast<std::size_t>(std::count_if(work_.begin(), work_.end(), [](const BucketWork& w) { return w.gather; }));
}

void MuonStep::prepare(const ChunkGradsFn& chunk_grads, const at::Tensor& momentum, const at::Tensor& update,
                       float grad_scale, comm::Communicator& comm) const {
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(compute_);
  for (const BucketWork& w : work_) {
    if (w.parts.empty() && !w.gather) continue;
    const Bucket& b = layout_.buckets()[static_cast<std::size_t>(w.bucket)];
    // v on this rank's chunk (zeros where no matrix is: the other
    // parameters, the padding).
    at::Tensor v_chunk = at::zeros({i64(b.chunk)}, fp32);
    if (!w.parts.empty()) {
      const at::Tensor g = chunk_grads(b);
      for (const Part& p : w.parts) {
        const at::Tensor gs = g.narrow(0, i64(p.in_chunk), i64(p.n)).to(at::kFloat).mul(grad_scale);
        at::Tensor m = momentum.narrow(0, i64(b.partition_offset + p.in_chunk), i64(p.n));
        m.lerp_(gs, 1.0f - momentum_);
        v_chunk.narrow(0, i64(p.in_chunk), i64(p.n)).copy_(gs.lerp(m, momentum_));
      }
    }
    // v of every matrix this rank holds a part of, from `base` on.
    at::Tensor v = v_chunk;
    std::size_t base = b.offset + static_cast<std::size_t>(shard_rank_) * b.chunk;
    if (w.gather) {
      v = at::empty({i64(b.padded)}, fp32);
      comm::AllGatherOptions options;
      options.tag = bucket_tag(w.bucket);
      comm.all_gather(v_chunk.data_ptr(), v.data_ptr(), b.chunk, DType::kFloat32, options)->wait();
      base = b.offset;
    }
    for (std::size_t mi : w.whole) {
      const Matrix& mx = matrices_[mi];
      const ParamSlot& s = layout_.params()[static_cast<std::size_t>(mx.param)];
      const at::Tensor u =
          muon_orthogonalize(v.narrow(0, i64(s.offset - base), i64(s.numel)).view({mx.rows, mx.cols}), method_)
              .view({-1});
      for (const Part& p : w.parts) {
        if (p.matrix != mi) continue;
        update.narrow(0, i64(b.partition_offset + p.in_chunk), i64(p.n)).copy_(u.narrow(0, i64(p.in_param), i64(p.n)));
      }
    }
  }
}

}  // namespace zero::detail
