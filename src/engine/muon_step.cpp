#include "muon_step.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include <ATen/ops/empty.h>

namespace zero::detail {
namespace {

std::int64_t i64(std::size_t v) { return static_cast<std::int64_t>(v); }

}  // namespace

MuonStep::MuonStep(const FlatLayout& layout, int shard_rank, std::vector<Matrix> matrices, float momentum,
                   NsMethod method, c10::Device compute, std::size_t window_bytes)
    : layout_(layout),
      shard_rank_(shard_rank),
      matrices_(std::move(matrices)),
      momentum_(momentum),
      method_(method),
      compute_(compute),
      window_bytes_(window_bytes) {
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

std::size_t MuonStep::test_window_bytes() {
  const char* v = std::getenv("ZERO_TEST_MUON_GATHER_WINDOW_BYTES");
  return v != nullptr && std::atoll(v) > 0 ? static_cast<std::size_t>(std::atoll(v)) : kGatherWindowBytes;
}

void MuonStep::prepare(const ChunkGradsFn& chunk_grads, const at::Tensor& momentum, const at::Tensor& update,
                       float grad_scale, comm::Communicator& comm) const {
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(compute_);
  const auto world = static_cast<std::size_t>(layout_.shard_world());
  for (const BucketWork& w : work_) {
    if (w.parts.empty() && !w.gather) continue;
    const Bucket& b = layout_.buckets()[static_cast<std::size_t>(w.bucket)];
    const std::size_t chunk_begin = b.offset + static_cast<std::size_t>(shard_rank_) * b.chunk;
    // The momentum and v of this rank's parts; v in the update's place
    // until it is orthogonalized (the rest of that place, Adam's second
    // moments, is sent along but not used).
    if (!w.parts.empty()) {
      const at::Tensor g = chunk_grads(b);
      for (const Part& p : w.parts) {
        const at::Tensor gs = g.narrow(0, i64(p.in_chunk), i64(p.n)).to(at::kFloat).mul(grad_scale);
        at::Tensor m = momentum.narrow(0, i64(b.partition_offset + p.in_chunk), i64(p.n));
        m.lerp_(gs, 1.0f - momentum_);
        update.narrow(0, i64(b.partition_offset + p.in_chunk), i64(p.n)).copy_(gs.lerp(m, momentum_));
      }
    }
    const at::Tensor v_chunk = update.narrow(0, i64(b.partition_offset), i64(b.chunk));
    // Each matrix this rank holds a part of, whole, on the compute device.
    std::vector<at::Tensor> whole(w.whole.size());
    for (std::size_t k = 0; k < w.whole.size(); ++k) {
      const ParamSlot& s = layout_.params()[static_cast<std::size_t>(matrices_[w.whole[k]].param)];
      if (!w.gather) {  // (in this rank's chunk)
        whole[k] = v_chunk.narrow(0, i64(s.offset - chunk_begin), i64(s.numel)).to(compute_, /*non_blocking=*/false,
                                                                                   /*copy=*/true);
      } else {
        whole[k] = at::empty({i64(s.numel)}, fp32);
      }
    }
    if (w.gather) {
      // The chunks' v, kGatherWindowBytes at a time: window [off, off + n)
      // of every rank's chunk, copied into the matrices that need it.
      const std::size_t window = std::max<std::size_t>(1, window_bytes_ / sizeof(float) / world);
      const at::Tensor send = at::empty({i64(std::min(window, b.chunk))}, fp32);
      const at::Tensor recv = at::empty({i64(world * std::min(window, b.chunk))}, fp32);
      for (std::size_t off = 0; off < b.chunk; off += window) {
        const std::size_t n = std::min(window, b.chunk - off);
        send.narrow(0, 0, i64(n)).copy_(v_chunk.narrow(0, i64(off), i64(n)));
        comm::AllGatherOptions options;
        options.tag = bucket_tag(w.bucket);
        comm.all_gather(send.data_ptr(), recv.data_ptr(), n, DType::kFloat32, options)->wait();
        for (std::size_t r = 0; r < world; ++r) {
          const std::size_t from = b.offset + r * b.chunk + off;  // flat, n elements
          for (std::size_t k = 0; k < w.whole.size(); ++k) {
            const ParamSlot& s = layout_.params()[static_cast<std::size_t>(matrices_[w.whole[k]].param)];
            const std::size_t lo = std::max(from, s.offset), hi = std::min(from + n, s.offset + s.numel);
            if (lo >= hi) continue;
            whole[k].narrow(0, i64(lo - s.offset), i64(hi - lo)).copy_(recv.narrow(0, i64(r * n + lo - from), i64(hi - lo)));
          }
        }
      }
    }
    for (std::size_t k = 0; k < w.whole.size(); ++k) {
      const std::size_t mi = w.whole[k];
      const at::Tensor u = muon_update_direction(whole[k], matrices_[mi].shape, method_);
      for (const Part& p : w.parts) {
        if (p.matrix != mi) continue;
        update.narrow(0, i64(b.partition_offset + p.in_chunk), i64(p.n)).copy_(u.narrow(0, i64(p.in_param), i64(p.n)));
      }
    }
  }
}

}  // namespace zero::detail
