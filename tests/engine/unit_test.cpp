// zero::unit (zero/zero/unit.h), the marking stage 3 gathers and releases
// by, against a recording handler: gathered while the unit runs in forward
// and while its backward runs, released between; balanced for a unit called
// twice and under activation checkpointing; a plain call without a handler.
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include "zero/models/gpt.h"
#include "zero/zero/unit.h"

namespace zero {
namespace {

struct Recorder : UnitHandler {
  explicit Recorder(std::string n, std::vector<std::string>* l) : name(std::move(n)), log(l) {}
  void gather() override {
    ++live;
    ++gathers;
    log->push_back("gather " + name);
  }
  void release() override {
    ASSERT_GT(live, 0) << name << " released more than gathered";
    --live;
    log->push_back("release " + name);
  }
  void gather_until_backward_ends() override {
    ++live;
    ++gathers;
    log->push_back("gather " + name + " until the backward ends");
  }
  std::string name;
  std::vector<std::string>* log;
  int live = 0, gathers = 0;
};

struct Net : torch::nn::Module {
  Net() {
    a = register_module("a", torch::nn::Linear(8, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

TEST(Unit, WithoutAHandlerItIsThePlainCall) {
  torch::manual_seed(0);
  Net net;
  at::Tensor x = at::randn({2, 8});
  at::Tensor y = unit(*net.a, x, [&](const at::Tensor& in) { return net.a->forward(in); });
  EXPECT_TRUE(at::equal(y, net.a->forward(x)));
}

TEST(Unit, GatheredWhileItRunsForwardAndBackward) {
  torch::manual_seed(0);
  Net net;
  std::vector<std::string> log;
  Recorder ra("a", &log), rb("b", &log);
  set_unit_handler(*net.a, &ra);
  set_unit_handler(*net.b, &rb);
  // The unit's backward (whose nodes read its weights) must run while it is
  // gathered: a hook on a tensor inside the unit fires in that backward.
  int checked = 0;
  auto inside = [&](Recorder& r, const at::Tensor& t) {
    t.register_hook([&r, &checked](const at::Tensor& g) {
      EXPECT_GT(r.live, 0) << r.name << "'s backward ran while it was released";
      ++checked;
      return g;
    });
    return t;
  };
  // Data entering the first unit needs no gradient; the unit still knows
  // when its backward has ended.
  at::Tensor x = at::randn({2, 8});
  at::Tensor h = unit(*net.a, x, [&](const at::Tensor& in) {
    EXPECT_EQ(ra.live, 1);
    return at::tanh(inside(ra, net.a->forward(in)));
  });
  // b is called twice (its parameter used by two calls).
  at::Tensor y = unit(*net.b, h, [&](const at::Tensor& in) { return at::tanh(inside(rb, net.b->forward(in))); });
  y = unit(*net.b, y, [&](const at::Tensor& in) { return at::tanh(inside(rb, net.b->forward(in))); });
  EXPECT_EQ(ra.live + rb.live, 0) << "released after forward";
  y.sum().backward();
  EXPECT_EQ(checked, 3);  // b's weight twice, a's once
  EXPECT_EQ(ra.live, 0);
  EXPECT_EQ(rb.live, 0);
  const std::vector<std::string> expected = {
      "gather a", "release a", "gather b", "release b", "gather b", "release b",  // forward
      "gather b", "release b", "gather b", "release b", "gather a", "release a"};  // backward, reversed
  EXPECT_EQ(log, expected);
  set_unit_handler(*net.a, nullptr);
  set_unit_handler(*net.b, nullptr);
  EXPECT_EQ(unit_handler(*net.a), nullptr);
}

TEST(Unit, TheGptMarksItsBlocksAlsoUnderCheckpointing) {
  for (bool checkpoint : {false, true}) {
    torch::manual_seed(0);
    models::GptConfig c = models::gpt_preset("gpt2-tiny");
    c.checkpoint_activations = checkpoint;
    models::Gpt gpt(c);
    std::vector<std::string> log;
    std::vector<std::unique_ptr<Recorder>> recs;
    int i = 0;
    for (const auto& child : gpt.named_children()) {
      if (child.key().rfind("h", 0) != 0) continue;
      recs.push_back(std::make_unique<Recorder>("block" + std::to_string(i++), &log));
      set_unit_handler(*child.value(), recs.back().get());
    }
    ASSERT_EQ(recs.size(), static_cast<std::size_t>(c.n_layer)) << "one unit per block";
    at::Tensor idx = at::randint(c.vocab_size, {2, 17}, at::TensorOptions().dtype(at::kLong));
    gpt.loss(idx.narrow(1, 0, 16), idx.narrow(1, 1, 16)).backward();
    for (const auto& r : recs) {
      EXPECT_EQ(r->live, 0) << r->name << (checkpoint ? " (checkpointed)" : "");
      EXPECT_EQ(r->gathers, 2) << r->name << ": once in forward, once in backward";
    }
    for (const auto& child : gpt.named_children()) set_unit_handler(*child.value(), nullptr);
  }
}

}  // namespace
}  // namespace zero
