// fault_driver: a small data-parallel training job that plants one fault on
// one rank, for tests/faults/faults_test.sh. Every fault must end the job
// the way docs/reliability.md says: one clear error, a non-zero exit, no hang.
//
//   fault_driver --inject KIND --rank R --step S [--steps N] [--timeout SEC]
//                [--policy skip|stop] [--stop-after K] [--stage Z] [--tag NAME]
//
// KIND, done by rank R just before the backward of step S (1-based):
//   none       trains N steps, prints "trained N steps, skipped K" on rank 0
//   stop       raise(SIGSTOP): the rank stops answering
//   kill       raise(SIGKILL)
//   sleep      sleeps 4 x timeout, alive but not joining
//   mismatch   issues all_reduce with max where the others issue sum (MPI
//              completes it: only the sequence check notices)
//   count-mismatch  issues all_reduce of 8 floats where the others issue 4
//              (MPI fails it: the error must name the divergence, not abort)
//   kind-mismatch  issues all_gather of 4 floats per rank where the others
//              issue all_reduce of 4 (MPI would match the two and write past
//              the all-reduce's buffer: the error must name the divergence)
//   unit-order (stage 3) calls the model's two units in the other order:
//              with --unit-sizes same they are the same size, so MPI
//              completes the swapped gathers (only their tags differ); with
//              --unit-sizes differ it cannot
//   nan        makes its loss NaN (its gradients follow)
//   backward-throw  (stage 3, three units in a chain) its backward throws
//              between the last unit and the first, while the others go on
//              into the first unit's gather: the job must end with that
//              rank's error within seconds, not the others' timeout
//   nvme-read-fail  (stage 3, parameters on NVMe, six units through two
//              host buffers, so that each step reads them back) in the
//              backward of step S, one read of its parameter swap file
//              fails with EIO (pread is interposed below), where a unit is
//              fetched ahead: the rank must not go on without the gather
//              the others issued (a read tried again later would succeed):
//              the job ends with its I/O error within seconds
//   host-oom   (one process) limits its address space to what it maps now
//              plus 100 MiB before it builds the engine of a 16.8M-parameter
//              model (whose Adam state alone is 128 MiB): the engine must
//              say it ran out of host memory, not crash
//   gather-oom (one process, stage 3) builds the engine of a model with one
//              unit of 16.8M parameters, then limits its address space to
//              what it maps now plus 32 MiB: the unit's gather in the first
//              forward (64 MiB) must fail with the out-of-memory error, and
//              the engine, destroyed while that error unwinds, must not
//              need memory to give the module back
//   gather-oom-retry  the same, but the error is caught, the limit lifted,
//              and the forward tried again: it must train (the failed
//              gather left nothing half done)
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>

#include <csignal>
#include <fstream>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>

#include <ATen/ops/full.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randn.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "zero/comm/communicator.h"
#include "zero/comm/fail_job.h"
#include "zero/config/config.h"
#include "zero/core/error.h"
#include "zero/engine/engine.h"
#include "zero/zero/unit.h"

// The next g_reads_to_fail pread(2)s of the parameter swap file fail with
// EIO (nvme-read-fail). The engine's swap threads call it; other files read
// on.
std::atomic<int> g_reads_to_fail{0};

bool is_param_swap(int fd) {
  char link[64], target[4096];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::strstr(target, "zerocpp-params-rank") != nullptr;
}

extern "C" ssize_t pread(int fd, void* buf, size_t count, off_t offset) {
  using Fn = ssize_t (*)(int, void*, size_t, off_t);
  static const Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "pread"));
  if (g_reads_to_fail.load() > 0 && is_param_swap(fd) && g_reads_to_fail.fetch_sub(1) > 0) {
    errno = EIO;
    return -1;
  }
  return real(fd, buf, count, offset);
}

namespace {

struct Options {
  std::string inject = "none";
  int rank = -1;
  long step = 3;
  long steps = 6;
  double timeout = 5;
  std::string policy = "skip";
  long stop_after = 1;
  int stage = 2;
  std::string unit_sizes = "same";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--inject") o.inject = v;
    else if (k == "--rank") o.rank = std::stoi(v);
    else if (k == "--step") o.step = std::stol(v);
    else if (k == "--steps") o.steps = std::stol(v);
    else if (k == "--timeout") o.timeout = std::stod(v);
    else if (k == "--policy") o.policy = v;
    else if (k == "--stop-after") o.stop_after = std::stol(v);
    else if (k == "--stage") o.stage = std::stoi(v);
    else if (k == "--unit-sizes") o.unit_sizes = v;
    else if (k == "--tag") continue;  // names the job for the test script's pkill
    else throw zero::Error("fault_driver: unknown option " + k);
  }
  return o;
}

// RLIMIT_AS = what the process maps now + `extra` bytes (the soft limit:
// lift_address_space_limit() raises it again).
void limit_address_space(long extra) {
  std::ifstream status("/proc/self/status");
  std::string line;
  long kib = 0;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) kib = std::stol(line.substr(7));
  }
  ZERO_CHECK(kib > 0, "fault_driver: no VmSize in /proc/self/status");
  const rlim_t limit = static_cast<rlim_t>(kib) * 1024 + static_cast<rlim_t>(extra);
  rlimit r{};
  ZERO_CHECK(getrlimit(RLIMIT_AS, &r) == 0, "fault_driver: getrlimit failed");
  r.rlim_cur = limit;
  ZERO_CHECK(setrlimit(RLIMIT_AS, &r) == 0, "fault_driver: setrlimit failed");
}

void lift_address_space_limit() {
  rlimit r{};
  ZERO_CHECK(getrlimit(RLIMIT_AS, &r) == 0, "fault_driver: getrlimit failed");
  r.rlim_cur = r.rlim_max;
  ZERO_CHECK(setrlimit(RLIMIT_AS, &r) == 0, "fault_driver: setrlimit failed");
}

// A stage-3 engine whose one unit (a 4096 x 4096 linear, 64 MiB in fp32)
// cannot be gathered.
int gather_oom(zero::comm::Communicator& comm, bool retry) {
  const zero::config::Config cfg = zero::config::parse_config(
      R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3,
          "stage3_param_persistence_threshold": 0}})",
      comm.world_size(), "fault_driver");
  struct Net : torch::nn::Module {
    torch::nn::Linear in{16, 4096}, big{4096, 4096}, out{4096, 4};
    Net() {
      register_module("in", in);
      register_module("big", big);
      register_module("out", out);
      zero::mark_unit(*big);
    }
    at::Tensor forward(const at::Tensor& x) {
      const at::Tensor h = zero::unit(*big, in->forward(x), [&](const at::Tensor& v) { return big->forward(v); });
      return out->forward(h);
    }
  };
  auto model = std::make_shared<Net>();
  zero::Engine engine(model, cfg, comm);
  limit_address_space(32 << 20);
  if (retry) {
    try {
      (void)model->forward(at::randn({4, 16}));
      throw zero::Error("fault_driver: the gather did not run out of memory");
    } catch (const zero::Error& e) {
      if (std::string(e.what()).find("out of host memory while gathering") == std::string::npos) throw;
      std::printf("caught: %.60s...\n", e.what());
    }
    lift_address_space_limit();
  }
  const at::Tensor loss = at::mse_loss(model->forward(at::randn({4, 16})), at::randn({4, 4}));
  engine.backward(loss);
  engine.step();
  std::printf("trained 1 step\n");
  return 0;
}

// Stage 3, two units side by side (y = a(x) + b(x)[:, :16]): the order they
// are called in changes nothing but the order of their collectives.
int unit_order(const Options& o, zero::comm::Communicator& comm) {
  const zero::config::Config cfg = zero::config::parse_config(
      "{\"train_micro_batch_size_per_gpu\": 4, \"comm_timeout\": " + std::to_string(o.timeout) +
          ", \"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0}}",
      comm.world_size(), "fault_driver");
  const long wide = o.unit_sizes == "same" ? 16 : 32;
  struct Net : torch::nn::Module {
    torch::nn::Linear a, b;
    Net(long wide) : a(16, 16), b(16, wide) {
      register_module("a", a);
      register_module("b", b);
      zero::mark_unit(*a);
      zero::mark_unit(*b);
    }
    at::Tensor forward(const at::Tensor& x, bool swapped) {
      auto run_a = [&] { return zero::unit(*a, x, [&](const at::Tensor& v) { return a->forward(v); }); };
      auto run_b = [&] { return zero::unit(*b, x, [&](const at::Tensor& v) { return b->forward(v); }).narrow(1, 0, 16); };
      if (swapped) {
        const at::Tensor yb = run_b();
        return run_a() + yb;
      }
      const at::Tensor ya = run_a();
      return ya + run_b();
    }
  };
  torch::manual_seed(7);
  auto model = std::make_shared<Net>(wide);
  zero::Engine engine(model, cfg, comm);
  torch::manual_seed(100 + comm.rank());
  for (long step = 1; step <= o.steps; ++step) {
    const bool swapped = comm.rank() == o.rank && step == o.step;
    const at::Tensor loss = at::mse_loss(model->forward(at::randn({4, 16}), swapped), at::randn({4, 16}));
    engine.backward(loss);
    engine.step();
  }
  if (comm.rank() == 0) std::printf("trained %ld steps\n", o.steps);
  comm.barrier()->wait();
  return 0;
}

// Identity forward; a backward that throws where `armed`.
struct ThrowInBackward : torch::autograd::Function<ThrowInBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, bool armed) {
    ctx->saved_data["armed"] = armed;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    if (ctx->saved_data["armed"].toBool()) throw zero::Error("fault_driver: this rank's backward failed (planted)");
    return {g[0], at::Tensor()};
  }
};

int backward_throw(const Options& o, zero::comm::Communicator& comm) {
  const zero::config::Config cfg = zero::config::parse_config(
      "{\"train_micro_batch_size_per_gpu\": 4, \"comm_timeout\": " + std::to_string(o.timeout) +
          ", \"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0, "
          "\"reduce_bucket_size\": 200}}",
      comm.world_size(), "fault_driver");
  struct Net : torch::nn::Module {
    torch::nn::Linear u1{16, 16}, u2{16, 16}, u3{16, 16};
    Net() {
      register_module("u1", u1);
      register_module("u2", u2);
      register_module("u3", u3);
      zero::mark_unit(*u1);
      zero::mark_unit(*u2);
      zero::mark_unit(*u3);
    }
    at::Tensor forward(const at::Tensor& x, bool armed) {
      at::Tensor h = zero::unit(*u1, x, [&](const at::Tensor& v) { return u1->forward(v); });
      h = ThrowInBackward::apply(h, armed);
      h = zero::unit(*u2, h, [&](const at::Tensor& v) { return u2->forward(v); });
      return zero::unit(*u3, h, [&](const at::Tensor& v) { return u3->forward(v); });
    }
  };
  torch::manual_seed(7);
  auto model = std::make_shared<Net>();
  zero::Engine engine(model, cfg, comm);
  torch::manual_seed(100 + comm.rank());
  for (long step = 1; step <= o.steps; ++step) {
    const bool armed = comm.rank() == o.rank && step == o.step;
    const at::Tensor loss = at::mse_loss(model->forward(at::randn({4, 16}), armed), at::randn({4, 16}));
    engine.backward(loss);
    engine.step();
  }
  if (comm.rank() == 0) std::printf("trained %ld steps\n", o.steps);
  comm.barrier()->wait();
  return 0;
}

int nvme_read_fail(const Options& o, zero::comm::Communicator& comm) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("zero_fault_nvme_" + std::to_string(::getppid()));
  std::filesystem::create_directories(dir);
  const zero::config::Config cfg = zero::config::parse_config(
      "{\"train_micro_batch_size_per_gpu\": 4, \"comm_timeout\": " + std::to_string(o.timeout) +
          ", \"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0, "
          "\"reduce_bucket_size\": 200, \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"nvme\", "
          "\"nvme_path\": \"" + dir.string() + "\", \"buffer_count\": 2}}}",
      comm.world_size(), "fault_driver");
  struct Net : torch::nn::Module {
    std::vector<torch::nn::Linear> units;
    Net() {
      for (int i = 0; i < 6; ++i) {
        units.emplace_back(16, 16);
        register_module("u" + std::to_string(i), units.back());
        zero::mark_unit(*units.back());
      }
    }
    at::Tensor forward(at::Tensor h) {
      for (torch::nn::Linear& u : units) h = zero::unit(*u, h, [&](const at::Tensor& v) { return at::tanh(u->forward(v)); });
      return h;
    }
  };
  torch::manual_seed(7);
  auto model = std::make_shared<Net>();
  zero::Engine engine(model, cfg, comm);
  torch::manual_seed(100 + comm.rank());
  for (long step = 1; step <= o.steps; ++step) {
    const at::Tensor loss = at::mse_loss(model->forward(at::randn({4, 16})), at::randn({4, 16}));
    if (comm.rank() == o.rank && step == o.step) g_reads_to_fail = 1;
    engine.backward(loss);
    engine.step();
  }
  ZERO_CHECK(g_reads_to_fail.load() <= 0, "fault_driver: the planted read failure never happened (no read of the "
             "parameter swap file in step ", o.step, "'s backward)");
  double sum = 0;
  for (const at::Tensor& p : engine.gather_master_params()) sum += p.to(at::kDouble).abs().sum().item<double>();
  if (comm.rank() == 0) std::printf("trained %ld steps, parameters' |sum| %.17g\n", o.steps, sum);
  comm.barrier()->wait();
  return 0;
}

int run(const Options& o, std::unique_ptr<zero::comm::Communicator>& comm_out) {
  comm_out = zero::comm::make_communicator();
  zero::comm::Communicator& comm = *comm_out;
  const std::string json = "{\"train_micro_batch_size_per_gpu\": 4, \"comm_timeout\": " + std::to_string(o.timeout) +
                           ", \"zero_optimization\": {\"stage\": " + std::to_string(o.stage) +
                           ", \"reduce_bucket_size\": 200}, \"nonfinite\": {\"policy\": \"" + o.policy +
                           "\", \"stop_after\": " + std::to_string(o.stop_after) + "}}";
  const zero::config::Config cfg = zero::config::parse_config(json, comm.world_size(), "fault_driver");
  torch::manual_seed(7);
  if (o.inject == "unit-order") return unit_order(o, comm);
  if (o.inject == "backward-throw") return backward_throw(o, comm);
  if (o.inject == "nvme-read-fail") return nvme_read_fail(o, comm);
  if (o.inject == "gather-oom" || o.inject == "gather-oom-retry") return gather_oom(comm, o.inject == "gather-oom-retry");
  const bool oom = o.inject == "host-oom";
  auto model = oom ? std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(4096, 4096))
                   : std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                                                                 torch::nn::Linear(32, 4));
  if (oom) limit_address_space(100 << 20);
  zero::Engine engine(model, cfg, comm);
  torch::manual_seed(100 + comm.rank());
  const bool me = comm.rank() == o.rank;
  for (long step = 1; step <= o.steps; ++step) {
    const at::Tensor x = at::randn({4, 16});
    const at::Tensor y = at::randn({4, 4});
    at::Tensor loss = at::mse_loss(model->forward(x), y);
    if (me && step == o.step) {
      if (o.inject == "stop") std::raise(SIGSTOP);
      if (o.inject == "kill") std::raise(SIGKILL);
      if (o.inject == "sleep") std::this_thread::sleep_for(std::chrono::duration<double>(4 * o.timeout));
      if (o.inject == "nan") loss = loss * std::numeric_limits<float>::quiet_NaN();
    }
    if (o.inject == "count-mismatch" && step == o.step) {
      float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
      comm.all_reduce(v, me ? 8 : 4, zero::DType::kFloat32, {})->wait();
    }
    if (o.inject == "kind-mismatch" && step == o.step) {
      std::vector<float> v(4 * static_cast<std::size_t>(comm.world_size()), 1.0f);
      if (me) {
        comm.all_gather(v.data() + 4 * comm.rank(), v.data(), 4, zero::DType::kFloat32)->wait();
      } else {
        comm.all_reduce(v.data(), 4, zero::DType::kFloat32, {})->wait();
      }
    }
    if (o.inject == "mismatch" && step == o.step) {
      float v[4] = {1, 2, 3, 4};
      zero::comm::AllReduceOptions ar;
      ar.op = me ? zero::comm::ReduceOp::kMax : zero::comm::ReduceOp::kSum;
      comm.all_reduce(v, 4, zero::DType::kFloat32, ar)->wait();
    }
    engine.backward(loss);
    engine.step();
  }
  if (comm.rank() == 0) {
    std::printf("trained %ld steps, skipped %lld\n", o.steps, static_cast<long long>(engine.stats().skipped));
  }
  comm.barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<zero::comm::Communicator> comm;
  try {
    return run(parse(argc, argv), comm);
  } catch (const std::exception& e) {
    zero::comm::fail_job(comm.get(), e, "fault_driver");
  }
}
