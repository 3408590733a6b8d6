#include "unit_schedule.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <c10/core/GradMode.h>

#include "zero/core/error.h"

namespace zero::detail {

UnitAssignment assign_units(const torch::nn::Module& root, const std::vector<at::Tensor>& params,
                            std::int64_t persistence_threshold) {
  UnitAssignment a;
  // A module registered under two names (a block shared by two layers) is
  // listed by named_modules() under each: it is one unit, named by the
  // first, found at either path.
  std::unordered_map<const torch::nn::Module*, int> index;
  std::unordered_map<std::string, int> unit_at;
  // For each parameter, the path of every module that registers it itself
  // (a tied weight has two: an embedding and a head; a shared block's
  // parameters one per name).
  std::unordered_map<const void*, std::vector<std::string>> registrants;
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const torch::nn::Module* m = item.value().get();
    for (const at::Tensor& p : m->parameters(/*recurse=*/false)) registrants[p.unsafeGetTensorImpl()].push_back(item.key());
    if (!is_unit(*m)) continue;
    const auto [it, first] = index.emplace(m, static_cast<int>(a.units.size()));
    if (first) {
      a.units.push_back(m);
      a.names.push_back(item.key());
    }
    unit_at.emplace(item.key(), it->second);
  }
  // The units around a module's path, innermost first.
  auto units_around = [&](std::string path) {
    std::vector<int> out;
    for (;;) {
      if (const auto it = unit_at.find(path); it != unit_at.end()) out.push_back(it->second);
      if (path.empty()) break;
      const std::size_t dot = path.rfind('.');
      path = dot == std::string::npos ? std::string() : path.substr(0, dot);
    }
    return out;
  };
  // A parameter belongs to the innermost unit around every module that
  // registers it: inside it, each of them runs while the unit is gathered.
  // Where no unit is around them all (two sibling blocks sharing a weight;
  // an embedding at the root tied to a head that is a unit), it stays
  // gathered.
  a.groups.assign(params.size(), -1);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() < persistence_threshold) continue;
    const auto it = registrants.find(params[i].unsafeGetTensorImpl());
    if (it == registrants.end() || it->second.empty()) continue;
    std::vector<int> around = units_around(it->second.front());
    for (std::size_t r = 1; r < it->second.size() && !around.empty(); ++r) {
      const std::vector<int> also = units_around(it->second[r]);
      std::erase_if(around, [&](int u) { return std::find(also.begin(), also.end(), u) == also.end(); });
    }
    if (!around.empty()) a.groups[i] = around.front();
  }
  return a;
}

UnitSchedule::UnitSchedule(const UnitAssignment& units, ParamStore& store, comm::Communicator& comm, Options options)
    : modules_(units.units), units_(units.units.size()), store_(store), comm_(comm), o_(options) {
  const FlatLayout& L = store.layout();
  handlers_.reserve(modules_.size());  // their addresses are registered
  for (std::size_t u = 0; u < modules_.size(); ++u) {
    units_[u].buckets = L.group_buckets(static_cast<int>(u));
    const bool trains = !units_[u].buckets.empty();
    for (int b : store.frozen_group_buckets(static_cast<int>(u))) units_[u].buckets.push_back(b);
    for (int b : units_[u].buckets) units_[u].elements += store.bucket(static_cast<std::size_t>(b)).padded;
    handlers_.emplace_back(this, static_cast<int>(u), trains, units.names[u]);
  }
  // A unit with nothing of its own to gather (shared with another unit, or
  // kept) gets no handler: zero::unit() then just calls it. One whose own
  // parameters are all frozen gets one that trains nothing, so that data
  // that needs no gradient does not become a leaf that does (a frozen stem
  // would otherwise be back-propagated through).
  for (std::size_t u = 0; u < modules_.size(); ++u) {
    if (!units_[u].buckets.empty()) set_unit_handler(*modules_[u], &handlers_[u]);
  }
}

UnitSchedule::~UnitSchedule() {
  for (std::size_t u = 0; u < modules_.size(); ++u) {
    if (!units_[u].buckets.empty()) set_unit_handler(*modules_[u], nullptr);
  }
  for (UnitState& s : units_) {
    for (auto& g : s.pending) {
      try {
        store_.finish_gather(g);  // the collective's and the copy's buffers are the store's
      } catch (...) {
      }
    }
  }
}

void UnitSchedule::start(int u) {
  UnitState& s = units_[static_cast<std::size_t>(u)];
  while (s.started < s.buckets.size()) start_next_bucket(s);
}

void UnitSchedule::start_next_bucket(UnitState& s) {
  const int b = s.buckets[s.started];
  s.pending.push_back(store_.start_gather(b, comm_));
  const std::size_t n = store_.bucket(static_cast<std::size_t>(b)).padded;
  ++s.started;
  s.started_elements += n;
  live_elements_ += n;
}

void UnitSchedule::finish(int u) {
  UnitState& s = units_[static_cast<std::size_t>(u)];
  for (auto& g : s.pending) store_.finish_gather(g);
  s.pending.clear();
}

void UnitSchedule::drop(int u) {
  UnitState& s = units_[static_cast<std::size_t>(u)];
  if (s.started == 0) return;
  if (s.prefetched) ++counts_.unused;
  s.prefetched = false;
  finish(u);
  release_buckets(s);
  live_elements_ -= s.started_elements;
  s.started = s.started_elements = 0;
}

void UnitSchedule::release_buckets(const UnitState& s) {
  for (int b : s.buckets) {
    if (store_.gathered(b)) store_.release(b);
    if (!in_backward_) store_.hollow(b);  // in backward: at its end (ParamStore::hollow)
  }
}

void UnitSchedule::abandon(int u) noexcept {
  UnitState& s = units_[static_cast<std::size_t>(u)];
  for (auto& g : s.pending) {
    try {
      store_.finish_gather(g);
    } catch (...) {
    }
  }
  s.pending.clear();
  release_buckets(s);
  live_elements_ -= s.started_elements;
  s.started = s.started_elements = 0;
  s.prefetched = false;
}

void UnitSchedule::gather(int u) {
  UnitState& s = units_[static_cast<std::size_t>(u)];
  const bool recorded = recording();  // (validation forwards are not part of a step)
  const std::size_t position = current_.size() + 1;
  // A step that departs from the recording here lets go of what the
  // recording had fetched ahead or kept gathered for it before this unit
  // is gathered: beside it, that would pass the plan's bound (the largest
  // unit plus the reach). A unit needed after all is gathered again.
  const bool departs =
      recorded && following_ && (position > recorded_.size() || recorded_[position - 1] != u);
  if (departs) following_ = false;
  if (s.refs++ == 0) {
    if (s.prefetched) ++counts_.used;
    s.prefetched = false;
    try {
      if (departs) let_go_of_unused();  // (not this unit: it has a reference now)
      start(u);  // what a prefetch has not started
      finish(u);
    } catch (...) {
      // The unit is not gathered: the caller's forward does not run, and a
      // later gather (after the error was handled) starts it afresh.
      abandon(u);
      --s.refs;
      throw;
    }
  } else if (departs) {
    let_go_of_unused();
  }
  if (!recorded) return;
  if (current_.size() >= recording_limit()) {
    overflowed_ = true;
    following_ = false;
    return;
  }
  current_.push_back(u);
  if (following_ && o_.prefetch) prefetch_after(position);
}

void UnitSchedule::let_go_of_unused() {
  for (std::size_t v = 0; v < units_.size(); ++v) {
    if (units_[v].refs == 0) drop(static_cast<int>(v));
  }
}

void UnitSchedule::gather_until_backward_ends(int u) {
  gather(u);
  until_backward_ends_.push_back(u);
}

void UnitSchedule::prefetch_after(std::size_t position) {
  std::size_t ahead = 0;
  for (std::size_t i = position; i < recorded_.size(); ++i) {
    const int v = recorded_[i];
    UnitState& t = units_[static_cast<std::size_t>(v)];
    if (t.refs > 0) continue;  // in use: nothing to fetch
    ahead += t.started_elements;  // fetched ahead already (all or some), or kept gathered
    const std::size_t before = t.started;
    try {
      while (t.started < t.buckets.size()) {
        const std::size_t n = store_.bucket(static_cast<std::size_t>(t.buckets[t.started])).padded;
        if (ahead + n > o_.prefetch_elements || live_elements_ + n > o_.max_live_elements) break;
        start_next_bucket(t);
        ahead += n;
      }
    } catch (...) {
      // Fetching ahead is an optimisation: alone, a unit that cannot be
      // fetched now (out of memory, a failed read from NVMe) is left to its
      // own gather, which reports it or succeeds. With other ranks it is
      // not: they issued this unit's all-gather, and this rank would issue
      // its next collectives in its place (MPI pairs them silently). The
      // error ends the step here, after the unit's started gathers.
      const bool others_gather = store_.layout().shard_world() > 1;
      abandon(v);
      if (others_gather) throw;
      break;
    }
    if (t.started > before) t.prefetched = true;
    if (t.started < t.buckets.size()) break;  // the reach ends inside this unit
  }
}

void UnitSchedule::release(int u) {
  UnitState& s = units_[static_cast<std::size_t>(u)];
  // After abort() the graph of the failed backward may still release what
  // abort() already did.
  if (s.refs == 0) return;
  if (--s.refs == 0 && !(recording() && needed_soon(u))) drop(u);
}

void UnitSchedule::backward_ended(int u, bool ran) {
  UnitState& s = units_[static_cast<std::size_t>(u)];
  if (s.backward_calls > 0) --s.backward_calls;
  // Under hold_all() (gather_parameters()) no unit is gathered in backward
  // and a parameter may be used outside its unit, earlier in forward: its
  // gradient may come after the unit's backward, and its bucket waits.
  if (ran && in_backward_ && s.backward_calls == 0 && holds_ == 0 && backward_done_) backward_done_(u);
}

bool UnitSchedule::recording() const { return in_backward_ || at::GradMode::is_enabled(); }

// Whether the recording has `u` again within what prefetch would fetch
// ahead from here: then it stays gathered instead of being released and
// fetched again at once (the last block of forward is the first of backward).
bool UnitSchedule::needed_soon(int u) const {
  if (!following_ || !o_.prefetch) return false;
  std::size_t ahead = 0;
  for (std::size_t i = current_.size(); i < recorded_.size(); ++i) {
    const int v = recorded_[i];
    if (v == u) return true;
    const UnitState& t = units_[static_cast<std::size_t>(v)];
    if (t.refs > 0) continue;
    ahead += t.elements;
    if (ahead > o_.prefetch_elements) return false;
  }
  return false;
}

void UnitSchedule::end_backward() {
  in_backward_ = false;
  for (int u : until_backward_ends_) release(u);
  until_backward_ends_.clear();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].refs == 0) drop(static_cast<int>(u));  // fetched ahead, not used
  }
  store_.hollow_released();  // those the backward released
  if (overflowed_) {
    recorded_.clear();
  } else if (current_ != recorded_) {
    recorded_ = current_;
  }
  current_.clear();
  overflowed_ = false;
  following_ = !recorded_.empty();
}

void UnitSchedule::abort() {
  until_backward_ends_.clear();
  // Under hold_all() every unit is gathered and finished, and stays so.
  for (std::size_t u = 0; u < units_.size(); ++u) {
    units_[u].refs = holds_;
    if (holds_ == 0) drop(static_cast<int>(u));
  }
  store_.hollow_released();
  current_.clear();
  overflowed_ = false;
  following_ = false;
  in_backward_ = false;
}

void UnitSchedule::hold_all() {
  std::size_t held = 0;
  try {
    for (; held < units_.size(); ++held) {
      start(static_cast<int>(held));
      ++units_[held].refs;
    }
    for (std::size_t u = 0; u < units_.size(); ++u) finish(static_cast<int>(u));
    store_.confirm_collectives();
    ++holds_;
  } catch (...) {
    // As if not called: what it started is waited for and released.
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (u < held) --units_[u].refs;
      if (units_[u].refs == 0) abandon(static_cast<int>(u));
    }
    throw;
  }
}

void UnitSchedule::release_all() {
  if (holds_ > 0) --holds_;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    UnitState& s = units_[u];
    if (s.refs > 0 && --s.refs == 0) drop(static_cast<int>(u));
  }
}

std::string UnitSchedule::describe(std::int64_t persistence_threshold, c10::ScalarType dtype) const {
  const FlatLayout& L = store_.layout();
  std::size_t kept = 0, kept_buckets = 0;
  for (const Bucket& b : L.buckets()) {
    kept += b.group < 0 ? b.numel : 0;
    kept_buckets += b.group < 0 ? 1 : 0;
  }
  if (units_.empty()) {
    return "zerocpp: stage 3: no module of the model is marked as a unit, so the whole model is one unit that "
           "stays gathered: every rank holds all " + std::to_string(L.numel()) + " parameters in " +
           c10::toString(dtype) + " (as at stage 2) beside its partition. Mark the model's blocks "
           "(zero::mark_unit(*block) at construction and zero::unit(*block, x, fn) in forward; docs/engine.md) so "
           "that only one block is gathered at a time.";
  }
  std::string out = "zerocpp: stage 3: " + std::to_string(units_.size()) + " units in " +
                    std::to_string(L.buckets().size() - kept_buckets) + " buckets; " + std::to_string(kept) + " of " +
                    std::to_string(L.numel()) + " parameters stay gathered, in " + std::to_string(kept_buckets) +
                    " buckets (no unit, shared by two units or with a module outside its unit, or below "
                    "stage3_param_persistence_threshold=" +
                    std::to_string(persistence_threshold) + " elements)";
  std::size_t largest = 0, largest_bucket = 0;
  for (const UnitState& u : units_) {
    largest = std::max(largest, u.elements);
    for (int b : u.buckets) largest_bucket = std::max(largest_bucket, store_.bucket(static_cast<std::size_t>(b)).padded);
  }
  if (o_.prefetch && largest > o_.prefetch_elements) {
    out += "; prefetch fetches at most " + std::to_string(o_.prefetch_elements) + " elements of the next units "
           "ahead, part of a unit of " + std::to_string(largest) + " (stage3_prefetch_bucket_size >= " +
           std::to_string(largest) + " fetches a whole one, at the cost of as many gathered elements more)";
    if (largest_bucket > o_.prefetch_elements) {
      out += "; a parameter of " + std::to_string(largest_bucket) + " elements, larger than that, is never fetched "
             "ahead";
    }
  }
  return out;
}

bool UnitSchedule::shares_gathered_memory(int u, const at::Tensor& t) const {
  const UnitState& s = units_[static_cast<std::size_t>(u)];
  return std::any_of(s.buckets.begin(), s.buckets.end(), [&](int b) { return store_.in_bucket(b, t); });
}

UnitSchedule::PrefetchCounts UnitSchedule::take_prefetched() {
  const PrefetchCounts c = counts_;
  counts_ = {};
  return c;
}

}  // namespace zero::detail
