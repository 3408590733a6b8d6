#include "zero/zero/unit.h"

#include <iterator>
#include <memory>
#include <mutex>

#include <c10/core/GradMode.h>
#include <unordered_map>

#include "zero/core/error.h"

namespace zero {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const torch::nn::Module*, UnitHandler*>& registry() {
  static std::unordered_map<const torch::nn::Module*, UnitHandler*> r;
  return r;
}
// Marked units, by address; the weak pointer tells a live module from a new
// one allocated where a freed marked module was.
std::unordered_map<const torch::nn::Module*, std::weak_ptr<const torch::nn::Module>>& marks() {
  static std::unordered_map<const torch::nn::Module*, std::weak_ptr<const torch::nn::Module>> m;
  return m;
}

// The backward half of one call of a unit: gathered when the output's
// gradient arrives (before the unit's backward), released when the input's
// gradient has been computed (after it) — or, if the backward never reaches
// the input, when the graph holding the hooks is freed. The graph may
// outlive the engine (its hooks live as long as the graph): the handler is
// used only while it is alive (its liveness token, not its address, which a
// new engine's handler may reuse); once the engine is gone the module holds
// its parameters again and the backward is plain LibTorch's. (The graph's
// backward runs on one thread, as does the engine's destruction.)
//
// A backward run with create_graph (a gradient penalty's autograd::grad)
// makes nodes that read the parameters when the graph they belong to runs
// backward in turn: the unit then stays gathered until the engine's
// backward ends. The call's backward is reported ended once, when it first
// reaches the input (or when the graph is freed).
struct BackwardState {
  BackwardState(UnitHandler* h, bool until_end) : handler(h), alive(h->liveness()), until_backward_ends(until_end) {
    if (!until_backward_ends) {
      expected = true;
      handler->expect_backward();
    }
  }
  ~BackwardState() {
    release();
    end(/*ran=*/false);
  }
  void end(bool ran) {
    if (expected && !ended) {
      ended = true;
      if (!alive.expired()) handler->backward_ended(ran);
    }
  }
  void gather() {
    if (!gathered) {
      gathered = true;
      if (alive.expired()) return;
      if (until_backward_ends || at::GradMode::is_enabled()) {
        released = true;  // the handler releases it
        handler->gather_until_backward_ends();
      } else {
        handler->gather();
      }
    }
  }
  void release() {
    if (gathered && !released) {
      released = true;
      if (!alive.expired()) handler->release();
    }
  }
  UnitHandler* handler;
  std::weak_ptr<const void> alive;
  bool until_backward_ends = false;
  bool gathered = false, released = false;
  bool expected = false, ended = false;
};

}  // namespace

void mark_unit(const torch::nn::Module& m) {
  std::shared_ptr<const torch::nn::Module> owner;
  try {
    owner = m.shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    ZERO_CHECK(false, "zero::mark_unit: module '", m.name(), "' is not owned by a shared_ptr; mark a registered "
               "submodule (register_module(...)) or a module made with std::make_shared");
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& all = marks();
  // Drop the marks of modules that are gone, now and then.
  if (all.size() > 64 && all.size() % 64 == 0) {
    for (auto it = all.begin(); it != all.end();) it = it->second.expired() ? all.erase(it) : std::next(it);
  }
  all[&m] = owner;
}

bool is_unit(const torch::nn::Module& m) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto it = marks().find(&m);
  if (it == marks().end()) return false;
  const auto owner = it->second.lock();
  return owner && owner.get() == &m;
}

void set_unit_handler(const torch::nn::Module& m, UnitHandler* handler) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (handler == nullptr) {
    registry().erase(&m);
  } else {
    registry()[&m] = handler;
  }
}

UnitHandler* unit_handler(const torch::nn::Module& m) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto it = registry().find(&m);
  return it == registry().end() ? nullptr : it->second;
}

at::Tensor unit(const torch::nn::Module& m, const at::Tensor& x,
                const std::function<at::Tensor(const at::Tensor&)>& fn) {
  UnitHandler* h = unit_handler(m);
  if (h == nullptr) {
    if (!is_unit(m)) mark_unit(m);
    return fn(x);
  }
  // A view of the input of its own, made before fn runs, so that its
  // gradient hook fires once the unit's whole backward has run (autograd
  // runs later-made nodes first: those of fn, including the ones computed
  // from the unit's parameters alone) and not when other users of x have.
  // An input that needs no gradient (data entering a first unit) is made a
  // leaf that does, under grad mode, and copied (the leaf's own hook would
  // fire at once, as soon as its gradient exists; and LibTorch refuses an
  // in-place op on a view of a leaf that needs a gradient, where the plain
  // model may change its data in place: an in-place ReLU first). One that
  // cannot have a gradient (integer token ids) is the end of the backward.
  const bool track = at::GradMode::is_enabled();
  const bool differentiable = x.is_floating_point() || x.is_complex();
  const at::Tensor in = !track || !differentiable ? x
                        : x.requires_grad()        ? x.view_as(x)
                        : h->trains_parameters()   ? x.detach().requires_grad_(true).clone()
                                                   : x;
  h->gather();
  at::Tensor out;
  try {
    out = fn(in);
  } catch (...) {
    h->release();
    throw;
  }
  const bool view_of_parameters = out.defined() && h->shares_gathered_memory(out);
  h->release();
  const std::string path = h->path();  // (its class alone does not tell one block from another)
  const std::string named = path.empty() ? "'" + m.name() + "'" : "'" + path + "' (" + m.name() + ")";
  ZERO_CHECK(!view_of_parameters, "zero::unit: the output of unit ", named, " is a view of its own parameters, "
             "whose memory stage 3 releases when the unit returns: return a copy (e.g. the view's .clone()) or a "
             "result computed from them");
  if (track && out.requires_grad()) {
    auto state = std::make_shared<BackwardState>(h, /*until_end=*/!in.requires_grad());
    out.register_hook([state](const at::Tensor& g) {
      state->gather();
      return g;
    });
    if (in.requires_grad()) {
      in.register_hook([state](const at::Tensor& g) {
        state->release();
        state->end(/*ran=*/true);
        return g;
      });
    }
  }
  return out;
}

}  // namespace zero
