// One parameter's state read back from, and written into, the partitions
// (Engine::full_master, full_grad, full_optimizer_state and their setters;
// DeepSpeed's safe_get_full_* / safe_set_full_*).
//
// A parameter lies in one bucket, and each rank owns one contiguous chunk of
// every bucket (zero/zero/flat_layout.h), so a rank holds at most one
// contiguous part of it. Reading: each rank copies its part into a zeroed
// tensor of the parameter's size, and an all-reduce (a sum with zeros
// elsewhere, exact) gives every rank the whole. At stage 0 every rank owns
// everything: no collective. Writing: rank 0's value is broadcast, and each
// rank writes its part.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>

#include "engine_impl.h"
#include "rank_agreement.h"
#include "zero/config/key_suggestion.h"
#include "zero/core/error.h"
#include "zero/core/text_list.h"

namespace zero {

namespace {

using State = detail::OptimizerPartition::State;

std::int64_t i64(std::size_t v) { return static_cast<std::int64_t>(v); }

// The part of parameter `slot` that rank `shard_rank` owns: where it begins
// in the parameter, in the rank's chunk of the bucket, and how many elements.
struct OwnedPart {
  const Bucket* bucket;
  std::size_t in_param, in_chunk, n;
  std::size_t in_partition() const { return bucket->partition_offset + in_chunk; }
};
std::optional<OwnedPart> owned_part(const FlatLayout& L, const ParamSlot& slot, int shard_rank) {
  const Bucket& b = L.buckets()[static_cast<std::size_t>(slot.bucket)];
  const std::size_t chunk_begin = b.offset + static_cast<std::size_t>(shard_rank) * b.chunk;
  const std::size_t lo = std::max(slot.offset, chunk_begin);
  const std::size_t hi = std::min(slot.offset + slot.numel, chunk_begin + b.chunk);
  if (lo >= hi) return std::nullopt;
  return OwnedPart{&b, lo - slot.offset, lo - chunk_begin, hi - lo};
}

// The state a key names for a parameter, by the optimizer (and Muon's half).
struct StateKey {
  const char* key;
  State state;
};
std::vector<StateKey> state_keys(const config::OptimizerConfig& opt, bool muon_param) {
  if (opt.is_adagrad()) return {{"sum", State::kExpAvg}};
  if (opt.is_lion()) return {{"exp_avg", State::kExpAvg}};
  if (muon_param) return {{"momentum_buffer", State::kExpAvg}};
  return {{"exp_avg", State::kExpAvg}, {"exp_avg_sq", State::kExpAvgSq}};
}

// The engine's index of the trainable parameter `name` (either name of a
// tied weight); throws naming the problem (frozen, unknown, a near name).
std::size_t trained_index(const detail::ParamStore& P, const std::string& name) {
  const std::vector<std::string>& names = P.names();
  if (const auto it = std::find(names.begin(), names.end(), name); it != names.end()) {
    return static_cast<std::size_t>(it - names.begin());
  }
  // Another name of a trained tensor (a tied weight), or a frozen one.
  for (const auto& item : P.module()->named_parameters(/*recurse=*/true)) {
    if (item.key() != name) continue;
    for (std::size_t i = 0; i < P.params().size(); ++i) {
      if (P.params()[i].is_same(item.value())) return i;
    }
    ZERO_CHECK(false, "parameter '", name, "' is frozen (requires_grad false): the engine keeps no master weights, "
               "gradient or optimizer state for it; read it from the module");
  }
  std::vector<std::string_view> candidates(names.begin(), names.end());
  const std::optional<std::string_view> near = config::closest_key(name, candidates);
  ZERO_CHECK(false, "the module has no parameter named '", name, "'",
             near ? detail::str_cat(" (did you mean '", *near, "'?)") : std::string(), ": its trainable ones are ",
             detail::join_first(names, 5), " (named_parameters()'s names)");
  return 0;
}

// Parameter i's elements gathered from every rank's part: part(offset in the
// partition, n) gives this rank's, fp32 on `device`. A part that fails on
// one rank (NVMe, no memory for the copy) fails every rank, before the
// all-reduce.
at::Tensor gather_param(comm::Communicator& comm, const detail::ParamStore& P, int shard_rank,
                        const c10::Device& device, std::size_t i,
                        const std::function<at::Tensor(std::size_t, std::size_t)>& part, const char* what) {
  const FlatLayout& L = P.layout();
  const ParamSlot& slot = L.params()[i];
  at::Tensor full = at::zeros({i64(slot.numel)}, at::TensorOptions().dtype(at::kFloat).device(device));
  const std::optional<OwnedPart> mine = owned_part(L, slot, shard_rank);
  const bool collective = L.shard_world() > 1;
  detail::agree_if(collective, comm, device, detail::error_of([&] {
                     if (mine) full.narrow(0, i64(mine->in_param), i64(mine->n)).copy_(part(mine->in_partition(), mine->n));
                   }),
                   what);
  if (collective && slot.numel > 0) comm.all_reduce(full.data_ptr(), slot.numel, DType::kFloat32)->wait();
  return full.to(at::kCPU).view(P.shape(i)).clone();
}

bool stepped_by_muon(const detail::OptimizerPartition& opt, std::size_t i) {
  const detail::ParamHypers& h = opt.hypers();
  return !h.empty() && h.classes[static_cast<std::size_t>(h.of_param[i])].muon != 0;
}

// The state `key` names for parameter i.
State state_named(const config::OptimizerConfig& opt, const detail::OptimizerPartition& partition,
                  const std::string& param, std::size_t i, const std::string& key) {
  const bool muon_param = stepped_by_muon(partition, i);
  std::vector<std::string> keys;
  for (const StateKey& k : state_keys(opt, muon_param)) {
    if (key == k.key) return k.state;
    keys.emplace_back(k.key);
  }
  ZERO_CHECK(false, "optimizer ", opt.type, " keeps no state '", key, "' for parameter '", param, "'",
             muon_param ? " (stepped by Muon)" : "", ": its states are ", detail::join_first(keys, keys.size()));
  return State::kMaster;
}

// A setter's value: checked on every rank (a wrong one fails all of them
// alike), then rank 0's, fp32 on the engine's device, flat.
at::Tensor rank0_value(comm::Communicator& comm, const c10::Device& device, const at::Tensor& value,
                       c10::IntArrayRef shape, const std::string& what) {
  detail::agree(comm, device, detail::error_of([&] {
                  ZERO_CHECK(value.defined() && at::isFloatingType(value.scalar_type()), what,
                             ": the value must be a floating-point tensor");
                  ZERO_CHECK(value.sizes() == shape, what, ": the value has shape ", value.sizes(),
                             ", the parameter ", shape);
                }),
                what);
  at::Tensor v = value.detach().to(at::TensorOptions().dtype(at::kFloat).device(device)).contiguous().clone().view(-1);
  if (comm.world_size() > 1 && v.numel() > 0) {
    comm.broadcast(v.data_ptr(), static_cast<std::size_t>(v.numel()), DType::kFloat32, {0})->wait();
  }
  return v;
}


}  // namespace

at::Tensor Engine::full_master(const std::string& name) {
  Impl& m = *impl_;
  m.check_not_damaged("full_master");
  at::NoGradGuard no_grad;
  const std::size_t i = trained_index(*m.params, name);
  m.delayed->wait();
  return gather_param(
      comm_, *m.params, m.plan.shard_rank, m.ctx.device, i,
      [&](std::size_t at, std::size_t n) { return m.optimizer->state_slice(State::kMaster, at, n); },
      "reading the master weights");
}

at::Tensor Engine::full_grad(const std::string& name) {
  Impl& m = *impl_;
  m.check_not_damaged("full_grad");
  at::NoGradGuard no_grad;
  const std::size_t i = trained_index(*m.params, name);
  ZERO_CHECK(m.backward_done && is_accumulation_boundary(), "full_grad('", name, "') ",
             m.backward_done ? "in the middle of an accumulation window (the window's gradients are not all summed)"
                             : "without a backward() whose step() is still to come",
             ": call it after the backward() that ends the window (micro-batch ",
             config_.gradient_accumulation_steps, " of ", config_.gradient_accumulation_steps,
             ") and before its step()");
  // The copies down (ZeRO-Offload on a GPU) are done before the host reads.
  if (m.ctx.on_accelerator()) {
    m.ctx.current_stream().synchronize();
    if (m.ctx.copy_stream) m.ctx.copy_stream->synchronize();
  }
  const int buf = m.grads->current();
  const FlatLayout& L = m.params->layout();
  const std::size_t split = m.optimizer->split();
  at::Tensor g = gather_param(
      comm_, *m.params, m.plan.shard_rank, m.ctx.device, i,
      [&](std::size_t at, std::size_t n) {
        const Bucket& b = L.buckets()[static_cast<std::size_t>(L.params()[i].bucket)];
        const std::size_t offset = at - b.partition_offset;
        // (A range read in one piece lies on one side of the offload split.)
        const std::size_t cut = std::clamp(split, at, at + n) - at;
        std::vector<at::Tensor> sides;
        const auto options = at::TensorOptions().dtype(at::kFloat).device(m.ctx.device);
        if (cut > 0) sides.push_back(m.grads->piece(b, offset, cut, buf).to(options));
        if (cut < n) sides.push_back(m.grads->piece(b, offset + cut, n - cut, buf).to(options));
        return sides.size() == 1 ? sides.front() : at::cat(sides);
      },
      "reading the gradient");
  // The buffers hold the window's sum over the ranks (in fp16 their mean:
  // grad_reducer.h's predivide), times the loss scale.
  return g.div_(static_cast<double>(m.world) / m.grads->predivided() * m.precision.loss_scale());
}


void Engine::set_full_master(const std::string& name, const at::Tensor& value) {
  Impl& m = *impl_;
  m.check_not_damaged("set_full_master");
  at::NoGradGuard no_grad;
  const std::size_t i = trained_index(*m.params, name);
  refuse_mid_window(m.micro_step, m.backward_done, config_.gradient_accumulation_steps, "set_full_master()");
  const at::Tensor v = rank0_value(comm_, m.ctx.device, value, m.params->shape(i), "set_full_master('" + name + "')");
  // The pending update goes into the model first: it would otherwise
  // overwrite this value with the one computed before it.
  flush();
  last_checkpoint_.stall_s += m.fence_save(ledger_);
  detail::ParamStore& P = *m.params;
  P.settle_gathers();  // no copy up still reads the partition written here
  P.wait_up();
  const std::optional<OwnedPart> mine = owned_part(P.layout(), P.layout().params()[i], m.plan.shard_rank);
  detail::agree_if(comm_.world_size() > 1, comm_, m.ctx.device,
                   detail::error_of([&] {
                     if (!mine) return;
                     const at::Tensor part = v.narrow(0, i64(mine->in_param), i64(mine->n));
                     m.optimizer->write_state_slice(State::kMaster, mine->in_partition(), part);
                     P.write_chunk_range(*mine->bucket, mine->in_chunk, part.to(m.precision.dtype()));
                   }),
                   "set_full_master");
  P.publish(at::Tensor(), /*offloaded=*/false, comm_, m.ctx);  // the all-gather
}

void Engine::set_full_optimizer_state(const std::string& name, const std::string& key, const at::Tensor& value) {
  Impl& m = *impl_;
  m.check_not_damaged("set_full_optimizer_state");
  at::NoGradGuard no_grad;
  const std::size_t i = trained_index(*m.params, name);
  const State state = state_named(config_.optimizer, *m.optimizer, name, i, key);
  refuse_mid_window(m.micro_step, m.backward_done, config_.gradient_accumulation_steps,
                    "set_full_optimizer_state()");
  const at::Tensor v = rank0_value(comm_, m.ctx.device, value, m.params->shape(i),
                                   "set_full_optimizer_state('" + name + "', '" + key + "')");
  m.delayed->wait();  // (the worker steps the moments)
  last_checkpoint_.stall_s += m.fence_save(ledger_);
  const std::optional<OwnedPart> mine = owned_part(m.params->layout(), m.params->layout().params()[i], m.plan.shard_rank);
  detail::agree_if(comm_.world_size() > 1, comm_, m.ctx.device,
                   detail::error_of([&] {
                     if (mine) {
                       m.optimizer->write_state_slice(state, mine->in_partition(),
                                                      v.narrow(0, i64(mine->in_param), i64(mine->n)));
                     }
                   }),
                   "set_full_optimizer_state");
}

at::Tensor Engine::full_optimizer_state(const std::string& name, const std::string& key) {
  Impl& m = *impl_;
  m.check_not_damaged("full_optimizer_state");
  at::NoGradGuard no_grad;
  const std::size_t i = trained_index(*m.params, name);
  const State state = state_named(config_.optimizer, *m.optimizer, name, i, key);
  m.delayed->wait();
  return gather_param(
      comm_, *m.params, m.plan.shard_rank, m.ctx.device, i,
      [&](std::size_t at, std::size_t n) { return m.optimizer->state_slice(state, at, n); },
      "reading the optimizer state");
}

std::vector<std::string> Engine::optimizer_state_keys(const std::string& name) const {
  const std::size_t i = trained_index(*impl_->params, name);
  std::vector<std::string> keys;
  for (const StateKey& k : state_keys(config_.optimizer, stepped_by_muon(*impl_->optimizer, i))) {
    keys.emplace_back(k.key);
  }
  return keys;
}

}  // namespace zero
