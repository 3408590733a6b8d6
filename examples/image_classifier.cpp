// A small convolutional image classifier trained with zerocpp's engine:
// ZeRO stage 2 with the optimizer offloaded to the CPU, on synthetic 16x16
// images of four patterns (horizontal stripes, vertical stripes, diagonal
// stripes, a checkerboard) under noise. Each rank draws its own images.
//
//   mpirun -np 2 image_classifier [config.json]      (default: the config below)
//
// What the engine asks of a training loop is three calls: engine.backward(loss),
// engine.step() and, at the end, engine.flush(). The module's own forward is
// unchanged.
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>

#include "zero/comm/communicator.h"
#include "zero/config/config.h"
#include "zero/engine/engine.h"

namespace F = torch::nn::functional;

struct ConvNet : torch::nn::Module {
  ConvNet() {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)));
    head = register_module("head", torch::nn::Linear(16 * 4 * 4, 4));
  }
  at::Tensor forward(at::Tensor x) {
    x = F::max_pool2d(torch::relu(c1->forward(x)), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(torch::relu(c2->forward(x)), F::MaxPool2dFuncOptions(2));
    return head->forward(x.flatten(1));
  }
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear head{nullptr};
};

// n images of class labels[i]: the class's pattern plus Gaussian noise.
std::pair<at::Tensor, at::Tensor> make_batch(std::int64_t n, std::uint64_t seed) {
  torch::manual_seed(seed);
  at::Tensor labels = torch::randint(4, {n}, torch::kLong);
  at::Tensor i = torch::arange(16).view({16, 1}).expand({16, 16});
  at::Tensor j = torch::arange(16).view({1, 16}).expand({16, 16});
  at::Tensor patterns = torch::stack({(i / 2) % 2, (j / 2) % 2, ((i + j) / 2) % 2, (i / 4 + j / 4) % 2})
                            .to(torch::kFloat) * 2 - 1;  // 4 x 16 x 16, values -1 / +1
  at::Tensor x = patterns.index_select(0, labels).unsqueeze(1) + 0.8 * torch::randn({n, 1, 16, 16});
  return {x, labels};
}

constexpr const char* kConfig = R"({
  "train_micro_batch_size_per_gpu": 32,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}
})";

int main(int argc, char** argv) try {
  auto comm = zero::comm::make_communicator();
  const int rank = comm->rank();
  const zero::config::Config cfg = argc > 1 ? zero::config::load_config(argv[1], comm->world_size())
                                            : zero::config::parse_config(kConfig, comm->world_size(), "<example>");
  torch::manual_seed(0);  // the engine broadcasts rank 0's weights anyway
  auto model = std::make_shared<ConvNet>();
  // As PyTorch's param groups would: the config's weight decay on the
  // kernels and the head's matrix, none on the biases.
  zero::EngineOptions options;
  options.weight_decay = zero::no_decay_below_2d();
  zero::Engine engine(model, cfg, *comm, std::move(options));
  const std::int64_t micro = cfg.train_micro_batch_size_per_gpu;
  // The steps: 80, or the second argument (examples/configs/ are zero-train's
  // GPT configs: lr 3e-4 after a 100-step warmup, which needs a few hundred).
  const int kSteps = argc > 2 ? std::stoi(argv[2]) : 80;
  if (kSteps < 1) throw std::invalid_argument("the number of steps (second argument) must be at least 1");
  float first = 0, last = 0;
  for (int step = 0; step < kSteps; ++step) {
    float window = 0;
    for (int m = 0; m < cfg.gradient_accumulation_steps; ++m) {
      auto [x, y] = make_batch(micro, 1000003ull * step + 101ull * m + static_cast<std::uint64_t>(rank));
      at::Tensor loss = F::cross_entropy(model->forward(x.to(engine.dtype())).to(torch::kFloat), y);
      engine.backward(loss);
      engine.step();
      window += loss.item<float>();
    }
    window /= static_cast<float>(cfg.gradient_accumulation_steps);
    comm->all_reduce(&window, 1, zero::DType::kFloat32)->wait();
    window /= static_cast<float>(comm->world_size());
    if (step == 0) first = window;
    last = window;
    if (rank == 0 && (step % 20 == 0 || step == kSteps - 1)) std::printf("step %3d  loss %.4f\n", step + 1, window);
  }
  engine.flush();
  // Accuracy on images no rank trained on.
  torch::NoGradGuard no_grad;
  auto [x, y] = make_batch(512, 777);
  const double acc = (model->forward(x.to(engine.dtype())).argmax(1) == y).to(torch::kFloat).mean().item<double>();
  if (rank == 0) {
    std::printf("loss %.4f -> %.4f over %d steps on %d rank(s); held-out accuracy %.1f%%\n", first, last, kSteps,
                comm->world_size(), 100 * acc);
    std::printf(last < 0.5f * first ? "the loss fell\n" : "the loss did NOT fall enough\n");
  }
  return last < 0.5f * first ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "image_classifier: %s\n", e.what());
  return 1;
}
