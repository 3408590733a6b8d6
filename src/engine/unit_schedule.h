// Stage 3's units as the model runs them: which modules are units
// (zero/zero/unit.h marks them), which parameters each one owns, and the
// gather and release of their buckets when zero::unit() asks — nested
// gathers counted, and with prefetch the next units' all-gathers started
// while the current one computes.
//
// Ownership: a parameter belongs to the innermost marked unit that holds it;
// one held by two units neither inside the other (a tied embedding and
// output head) belongs to none, as do parameters of no unit and those below
// stage3_param_persistence_threshold elements: they stay gathered.
//
// Prefetch: the order in which units are gathered in one step (forward and
// backward, from the end of one backward to the end of the next) is recorded;
// on the next steps, gathering a unit where the recorded order has it also
// starts the all-gathers of the units that follow, bucket by bucket, up to
// stage3_prefetch_bucket_size elements ahead and stage3_max_live_parameters
// gathered at once: a unit larger than that reach (a 4.5B GPT's block is
// 113M elements, DeepSpeed's default reach 50M) has its first buckets
// fetched ahead, as DeepSpeed fetches parameters up to the bucket size; a
// unit released where the recording has it again within that reach stays
// gathered. A step whose order differs from the recording stops
// prefetching for the rest of that step and becomes the new recording. Every
// rank must run the units in the same order (their all-gathers pair up).
// Forwards without gradients (validation) gather and release unit by unit
// but are neither recorded nor prefetched for. Forwards with gradients and
// no backward (a validation loop without NoGradGuard, a generation loop)
// are recorded as part of the step, up to recording_limit() gathers (16 per
// unit + 4096: far above any step's forward, recompute and backward): past
// it the recording is dropped at the next backward's end, and the step
// after records afresh. Without the limit the recording grew by every such
// forward, and each gather that followed it scanned what was left of it.
// Private to zero_engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include "param_store.h"
#include "step_timeline.h"
#include "zero/comm/communicator.h"
#include "zero/zero/unit.h"

namespace zero::detail {

struct UnitAssignment {
  std::vector<const torch::nn::Module*> units;  // the marked modules, in module order
  std::vector<std::string> names;               // their names in the model ("" for the root)
  std::vector<int> groups;                      // per trainable parameter: its unit, or -1
};

// params: the trainable parameters, each once, in ParamStore's order.
UnitAssignment assign_units(const torch::nn::Module& root, const std::vector<at::Tensor>& params,
                            std::int64_t persistence_threshold);

class UnitSchedule {
 public:
  struct Options {
    bool prefetch = true;
    std::size_t prefetch_elements = 50'000'000;   // stage3_prefetch_bucket_size
    std::size_t max_live_elements = 1'000'000'000;  // stage3_max_live_parameters
  };
  // Registers a handler for every unit; removes them when destroyed.
  UnitSchedule(const UnitAssignment& units, ParamStore& store, comm::Communicator& comm, Options options);
  ~UnitSchedule();
  UnitSchedule(const UnitSchedule&) = delete;
  UnitSchedule& operator=(const UnitSchedule&) = delete;

  void gather(int unit);
  void release(int unit);
  // gather(), released at end_backward() (or abort()).
  void gather_until_backward_ends(int unit);
  // Whether `t` lives in one of the unit's gathered buckets.
  bool shares_gathered_memory(int unit, const at::Tensor& t) const;
  // Around the engine's backward (its gathers are recorded whatever the
  // grad mode inside autograd's engine).
  void begin_backward() { in_backward_ = true; }
  // Called inside the engine's backward when the backward of every call of
  // `unit` has reached the call's input: the unit's parameters get no
  // further gradient in this backward (autograd accumulates a parameter's
  // gradient as soon as the backward of its last use has run, before any
  // node that was ready with it). The gradient path reduces the unit's
  // buckets then, whether or not each parameter got a gradient on this
  // rank, so that every rank issues them at the same point. (Not under
  // hold_all(): no all-gather runs in that backward.)
  void on_backward_done(std::function<void(int unit)> done) { backward_done_ = std::move(done); }
  // After a backward: every unit released (prefetched ones unused are
  // released too); the step's order recorded.
  void end_backward();
  // After a backward that threw: everything the backward gathered released;
  // the holds of hold_all() (a gather_parameters() scope still open) kept.
  void abort();
  // Every unit's buckets gathered and held (one reference each) until
  // release_all(): Engine::gather_parameters(), and the engine going (the
  // module gets its values back). Collective. If it throws, nothing is held.
  void hold_all();
  void release_all();
  std::size_t count() const { return units_.size(); }
  // The most gathers one step's recording holds (see the top).
  std::size_t recording_limit() const { return 16 * units_.size() + 4096; }
  // What the engine says at construction: the units and what stays
  // gathered, or, with no unit, that the whole model does and the fix.
  std::string describe(std::int64_t persistence_threshold, c10::ScalarType dtype) const;
  // Units fetched ahead and then used, and fetched ahead in vain (the order
  // changed), since the last call.
  struct PrefetchCounts {
    std::int64_t used = 0, unused = 0;
  };
  PrefetchCounts take_prefetched();

 private:
  struct Handler : UnitHandler {
    Handler(UnitSchedule* s, int u, bool t, std::string p) : schedule(s), unit(u), trains(t), where(std::move(p)) {}
    bool trains_parameters() const override { return trains; }
    std::string path() const override { return where; }
    void gather() override { schedule->gather(unit); }
    void release() override { schedule->release(unit); }
    void gather_until_backward_ends() override { schedule->gather_until_backward_ends(unit); }
    void expect_backward() override { ++schedule->units_[static_cast<std::size_t>(unit)].backward_calls; }
    void backward_ended(bool ran) override { schedule->backward_ended(unit, ran); }
    bool shares_gathered_memory(const at::Tensor& t) const override {
      return schedule->shares_gathered_memory(unit, t);
    }
    UnitSchedule* schedule;
    int unit;
    bool trains;  // some of its buckets are trainable (not only frozen ones)
    std::string where;  // its name in the model ("" for the root: then its class names it)
  };
  struct UnitState {
    std::vector<int> buckets;  // ParamStore's numbering: trainable, then frozen ones
    std::size_t elements = 0;  // padded, of all its buckets
    int refs = 0;              // gathers not yet released
    // Its first `started` buckets are gathered or on their way (refs > 0, or
    // prefetched: a prefetch may have started only some); started_elements
    // of them, padded.
    std::size_t started = 0, started_elements = 0;
    bool prefetched = false;   // fetched ahead (all or some) and not used yet
    std::vector<ParamStore::PendingGather> pending;  // gathers started and not yet finished
    int backward_calls = 0;    // calls whose backward has not reached their input yet
  };
  void backward_ended(int unit, bool ran);
  // Starts the gathers of the unit's buckets not yet started.
  void start(int unit);
  // Starts the all-gather of its next bucket not yet started.
  void start_next_bucket(UnitState& s);
  void finish(int unit);
  void drop(int unit);
  // The unit's gathered buckets released, and made hollow unless a backward runs.
  void release_buckets(const UnitState& s);
  // After a gather of `unit` failed part-way (out of memory): its pending
  // copies and collectives waited for quietly, its buckets released, as if
  // it had never started. Never throws.
  void abandon(int unit) noexcept;
  void prefetch_after(std::size_t position);
  // Every unit with no reference released (fetched ahead, or kept gathered
  // for the recording).
  void let_go_of_unused();
  bool needed_soon(int unit) const;
  // A training step's gather (forward with gradients, or backward), not a
  // validation forward's.
  bool recording() const;

  std::vector<const torch::nn::Module*> modules_;
  std::vector<Handler> handlers_;
  std::vector<UnitState> units_;
  ParamStore& store_;
  comm::Communicator& comm_;
  Options o_;
  std::size_t live_elements_ = 0;
  std::vector<int> recorded_, current_;  // gather order: the last step's, this step's so far
  bool following_ = false;               // this step has matched the recording so far
  bool overflowed_ = false;              // this step passed recording_limit(): not a recording
  bool in_backward_ = false;
  std::vector<int> until_backward_ends_;  // units gathered by gather_until_backward_ends()
  int holds_ = 0;                         // hold_all()s not yet released: one reference on every unit each
  PrefetchCounts counts_;
  std::function<void(int)> backward_done_;
};

}  // namespace zero::detail
