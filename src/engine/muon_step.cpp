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
  views_.reserve(matrices_.size());
  for (const Matrix& m : matrices_) views_.push_back(muon_matrix(m.param, m.shape));
  plan_ = plan_muon(layout_, shard_rank_, views_);
}

std::size_t MuonStep::work_elements() const {
  return muon_work_elements(layout_, plan_, views_, window_bytes_, method_ == NsMethod::kGram);
}

std::size_t MuonStep::test_window_bytes() {
  const char* v = std::getenv("ZERO_TEST_MUON_GATHER_WINDOW_BYTES");
  return v != nullptr && std::atoll(v) > 0 ? static_cast<std::size_t>(std::atoll(v)) : kGatherWindowBytes;
}

void MuonStep::prepare(const ChunkGradsFn& chunk_grads, const at::Tensor& momentum, const at::Tensor& update,
                       float grad_scale, comm::Communicator& comm) const {
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(compute_);
  const auto world = static_cast<std::size_t>(layout_.shard_world());
  auto slot = [&](std::size_t mi) -> const ParamSlot& {
    return layout_.params()[static_cast<std::size_t>(matrices_[mi].param)];
  };
  // Orthogonalizes matrix mi from its v, whole, and writes this rank's part
  // of u where its v was.
  auto orthogonalize = [&](std::size_t mi, at::Tensor whole, const Bucket& b, const MuonBucketPlan& w) {
    const at::Tensor u = muon_update_direction(whole, matrices_[mi].shape, method_);
    whole.reset();
    for (const MuonPart& p : w.parts) {
      if (p.matrix != mi) continue;
      update.narrow(0, i64(b.partition_offset + p.in_chunk), i64(p.n)).copy_(u.narrow(0, i64(p.in_param), i64(p.n)));
    }
  };
  for (const MuonBucketPlan& w : plan_) {
    const Bucket& b = layout_.buckets()[static_cast<std::size_t>(w.bucket)];
    const std::size_t chunk_begin = b.offset + static_cast<std::size_t>(shard_rank_) * b.chunk;
    // The momentum and v of this rank's parts, in place: v in the update's
    // place until it is orthogonalized (the rest of that place, Adam's
    // second moments, is sent along but not used).
    if (!w.parts.empty()) {
      const at::Tensor g = chunk_grads(b);
      for (const MuonPart& p : w.parts) {
        at::Tensor v = update.narrow(0, i64(b.partition_offset + p.in_chunk), i64(p.n));
        v.copy_(g.narrow(0, i64(p.in_chunk), i64(p.n)));
        v.mul_(grad_scale);
        at::Tensor m = momentum.narrow(0, i64(b.partition_offset + p.in_chunk), i64(p.n));
        m.lerp_(v, 1.0f - momentum_);
        v.lerp_(m, momentum_);
      }
    }
    const at::Tensor v_chunk = update.narrow(0, i64(b.partition_offset), i64(b.chunk));
    // The shared matrices: the ends of every rank's chunk, window by window,
    // copied into those this rank holds a part of.
    std::vector<at::Tensor> shared(w.shared.size());
    for (std::size_t k = 0; k < w.shared.size(); ++k) shared[k] = at::empty({i64(slot(w.shared[k]).numel)}, fp32);
    if (w.gathers()) {
      const std::size_t window = muon_window_elements(w, b.chunk, static_cast<int>(world), window_bytes_);
      at::Tensor send = at::empty({i64(window)}, fp32), recv = at::empty({i64(world * window)}, fp32);
      for (const auto& [begin, end] : w.gather_ranges(b.chunk)) {
        for (std::size_t off = begin; off < end; off += window) {
          const std::size_t n = std::min(window, end - off);
          send.narrow(0, 0, i64(n)).copy_(v_chunk.narrow(0, i64(off), i64(n)));
          comm::AllGatherOptions options;
          options.tag = bucket_tag(w.bucket);
          comm.all_gather(send.data_ptr(), recv.data_ptr(), n, DType::kFloat32, options)->wait();
          for (std::size_t r = 0; r < world; ++r) {
            const std::size_t from = b.offset + r * b.chunk + off;  // flat, n elements
            for (std::size_t k = 0; k < w.shared.size(); ++k) {
              const ParamSlot& s = slot(w.shared[k]);
              const std::size_t lo = std::max(from, s.offset), hi = std::min(from + n, s.offset + s.numel);
              if (lo >= hi) continue;
              shared[k].narrow(0, i64(lo - s.offset), i64(hi - lo)).copy_(recv.narrow(0, i64(r * n + lo - from), i64(hi - lo)));
            }
          }
        }
      }
    }
    for (std::size_t k = 0; k < w.shared.size(); ++k) orthogonalize(w.shared[k], std::move(shared[k]), b, w);
    // The local ones from this rank's own v, one at a time (after the
    // gather, which may send their v along).
    for (std::size_t mi : w.local) {
      const ParamSlot& s = slot(mi);
      orthogonalize(mi, v_chunk.narrow(0, i64(s.offset - chunk_begin), i64(s.numel)).to(compute_, at::kFloat,
                                                                                     /*non_blocking=*/false, /*copy=*/true),
                    b, w);
    }
  }
}

}  // namespace zero::detail
