// zero-bench ckpt: checkpoint save and load throughput of the engine against
// the same disk's sequential write and read speed measured in the same run
// (every rank writing, then reading, a file as large as its checkpoint file
// at once, fsync'd, page cache dropped for the file before each read; through
// the page cache and with O_DIRECT, the faster counting), and
// the stall of an asynchronous save against a synchronous one: the save
// itself and, in the training step that follows it, the copy of what is not
// written yet (last_checkpoint().stall_s). Run it under mpirun for several
// ranks.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ops/randint.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/utils.h>

#include "commands.h"
#include "common/cli_range.h"
#include "common/tool_paths.h"
#include "job.h"
#include "zero/ckpt/checkpoint_dir.h"
#include "zero/comm/communicator.h"
#include "zero/core/error.h"
#include "zero/engine/engine.h"
#include "zero/models/gpt.h"

namespace zero::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct CkptOptions {
  std::int64_t layers = 8, embd = 1024, heads = 8;
  int stage = 2, rounds = 3;
  bool offload = true, json = false;
  std::string dir = "/tmp/zero_bench_ckpt";
  std::string nvme_path;  // the optimizer state on NVMe, in this folder (streamed to and from the checkpoint)
  bool param_nvme = false;  // and the parameter partition (stage 3)
};

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The page cache's copy of every file below `dir` dropped (clean pages:
// fsync'd), so that the next read comes from the disk.
void drop_cache(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// The disk's speed on one rank's share: a sequential write of `bytes`
// (fsync'd) and a cold read of it, every rank at once, in the checkpoint's
// block size, through the page cache and with O_DIRECT.
struct DiskSpeed {
  double write_s = 0, read_s = 0;
};
DiskSpeed disk_speed(const fs::path& file, std::uint64_t bytes, bool direct, comm::Communicator& comm) {
  constexpr std::size_t kBlock = std::size_t{8} << 20;
  void* mem = nullptr;
  ZERO_CHECK(::posix_memalign(&mem, 4096, kBlock) == 0, "out of memory");
  const std::unique_ptr<char, decltype(&std::free)> block(static_cast<char*>(mem), &std::free);
  std::memset(block.get(), 'z', kBlock);
  const int extra = direct ? O_DIRECT : 0;
  // Direct I/O wants whole 4 KiB blocks.
  const std::uint64_t size = direct ? (bytes + 4095) / 4096 * 4096 : bytes;
  DiskSpeed d;
  comm.barrier()->wait();
  const auto t0 = Clock::now();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | extra, 0644);
  ZERO_CHECK(fd >= 0, "cannot create ", file.string(), direct ? " with O_DIRECT" : "", ": ", std::strerror(errno));
  for (std::uint64_t done = 0; done < size;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, size - done));
    ZERO_CHECK(::write(fd, block.get(), n) == static_cast<ssize_t>(n), "write to ", file.string(), " failed");
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  comm.barrier()->wait();
  d.write_s = since(t0);
  drop_cache(file.parent_path());
  comm.barrier()->wait();
  const auto t1 = Clock::now();
  const int rfd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | extra);
  ZERO_CHECK(rfd >= 0, "cannot open ", file.string(), ": ", std::strerror(errno));
  while (::read(rfd, block.get(), kBlock) > 0) {
  }
  ::close(rfd);
  comm.barrier()->wait();
  d.read_s = since(t1);
  fs::remove(file);
  return d;
}

void run_ckpt_on(const CkptOptions& o, comm::Communicator& job) {
  comm::Communicator* const comm = &job;
  const int world = comm->world_size();
  const bool root = comm->rank() == 0;
  models::GptConfig g = models::gpt_preset("gpt2-tiny");
  g.n_layer = o.layers;
  g.n_embd = o.embd;
  g.n_head = o.heads;
  g.block_size = 64;
  torch::manual_seed(1);
  auto model = std::make_shared<models::Gpt>(g);
  config::Config cfg;
  cfg.train_micro_batch_size_per_gpu = 1;
  cfg.gradient_accumulation_steps = 1;
  cfg.train_batch_size = world;
  cfg.world_size = world;
  cfg.optimizer.type = "AdamW";
  cfg.zero_optimization.stage = o.stage;
  cfg.zero_optimization.offload_optimizer.device = !o.nvme_path.empty() ? "nvme" : o.offload ? "cpu" : "none";
  cfg.zero_optimization.offload_optimizer.nvme_path = o.nvme_path;
  if (o.param_nvme) {
    cfg.zero_optimization.offload_param.device = "nvme";
    cfg.zero_optimization.offload_param.nvme_path = o.nvme_path;
  }
  Engine engine(model, cfg, *comm);
  const at::Tensor batch = at::randint(g.vocab_size, {1, 65});
  engine.backward(model->loss(batch.narrow(1, 0, 64), batch.narrow(1, 1, 64)));
  engine.step();
  const fs::path dir = fs::path(o.dir) / ("np" + std::to_string(world));
  std::error_code ec;
  if (root) {
    ckpt::remove_tree(dir, ec);
    fs::create_directories(dir);
  }
  comm->barrier()->wait();

  // Rounds of: the disk alone, a synchronous save (the caller waits for
  // every file and the commit), an asynchronous one followed by a training
  // step (the stall: the save and the step's fence; then the commit), a cold
  // load. Medians: a
  // virtual disk's speed varies from one write to the next.
  std::vector<double> sync_t, async_t, stall_t, step_t, load_t, buffered_wt, buffered_rt, direct_wt, direct_rt;
  std::uint64_t bytes = 0;
  double total = 0.0;
  // Each round saves under new tags, as a training run does (removing the
  // previous round's checkpoints is not timed).
  for (int round = 0; round < o.rounds; ++round) {
    const std::string sync_tag = "sync-" + std::to_string(round), async_tag = "async-" + std::to_string(round);
    comm->barrier()->wait();
    auto t = Clock::now();
    engine.save_checkpoint(dir.string(), sync_tag);
    comm->barrier()->wait();
    sync_t.push_back(since(t));
    bytes = engine.last_checkpoint().bytes;
    float total_f = static_cast<float>(bytes);
    comm->all_reduce(&total_f, 1, DType::kFloat32)->wait();
    total = total_f;
    const fs::path disk_file = dir / ("disk_rank" + std::to_string(comm->rank()));
    const DiskSpeed buffered = disk_speed(disk_file, bytes, /*direct=*/false, *comm);
    buffered_wt.push_back(buffered.write_s);
    buffered_rt.push_back(buffered.read_s);
    const DiskSpeed direct = disk_speed(disk_file, bytes, /*direct=*/true, *comm);
    direct_wt.push_back(direct.write_s);
    direct_rt.push_back(direct.read_s);
    comm->barrier()->wait();
    t = Clock::now();
    engine.save_checkpoint(dir.string(), async_tag, {}, /*async=*/true);
    const double save_call = since(t);
    // Training goes on: one step, whose optimizer step copies what the
    // writer has not written of the partition yet (the fence).
    const auto step_began = Clock::now();
    engine.backward(model->loss(batch.narrow(1, 0, 64), batch.narrow(1, 1, 64)));
    engine.step();
    const double step_s = since(step_began);
    engine.wait_checkpoint();
    comm->barrier()->wait();
    stall_t.push_back(engine.last_checkpoint().stall_s);
    // From the save to the commit, the step included (the file is written
    // beside it).
    async_t.push_back(since(t));
    step_t.push_back(step_s - (stall_t.back() - save_call));  // the step, less its fence
    if (root) drop_cache(dir);
    comm->barrier()->wait();
    t = Clock::now();
    engine.load_checkpoint(dir.string(), sync_tag);
    comm->barrier()->wait();
    load_t.push_back(since(t));
    if (root) {
      ckpt::remove_tree(dir / sync_tag, ec);
      ckpt::remove_tree(dir / async_tag, ec);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double sync_s = median(sync_t), async_s = median(async_t), stall_s = median(stall_t), load_s = median(load_t);
  // The disk's speed: the faster way of each, so that the percentages are
  // of the best this disk did.
  const double buffered_w = median(buffered_wt), buffered_r = median(buffered_rt);
  const double direct_w = median(direct_wt), direct_r = median(direct_rt);
  const double disk_w = std::min(buffered_w, direct_w), disk_r = std::min(buffered_r, direct_r);
  if (root) ckpt::remove_tree(dir, ec);
  if (!root) return;
  const double mb = 1e6;
  std::printf("zero-bench ckpt: GPT %lld x %lld (%.1fM parameters), stage %d%s, %d rank(s), %.1f MB on rank 0, "
              "%.1f MB in all, folder %s, median of %d rounds\n",
              (long long)o.layers, (long long)o.embd, engine.num_parameters() / 1e6, o.stage,
              o.param_nvme ? " + offload to nvme, parameters too" : !o.nvme_path.empty() ? " + offload to nvme"
              : o.offload ? " + offload" : "", world, bytes / mb, total / mb, o.dir.c_str(), o.rounds);
  std::printf("  %-34s %9s %10s %9s\n", "", "seconds", "MB/s", "of disk");
  std::printf("  %-34s %9.3f %10.1f %9s\n", "disk: write + fsync, page cache", buffered_w, total / buffered_w / mb, "");
  std::printf("  %-34s %9.3f %10.1f %9s\n", "disk: write + fsync, O_DIRECT", direct_w, total / direct_w / mb, "");
  std::printf("  %-34s %9.3f %10.1f %9s\n", "disk: read (cold), page cache", buffered_r, total / buffered_r / mb, "");
  std::printf("  %-34s %9.3f %10.1f %9s\n", "disk: read, O_DIRECT", direct_r, total / direct_r / mb, "");
  std::printf("  (%% of disk: of the faster of the two)\n");
  std::printf("  %-34s %9.3f %10.1f %8.0f%%\n", "save (synchronous)", sync_s, total / sync_s / mb, 100 * disk_w / sync_s);
  const double step_s = median(step_t);
  std::printf("  %-34s %9.3f %10s %9s\n", "save (async) + a step, to commit", async_s, "", "");
  std::printf("  %-34s %9.3f %10s %9s\n", "  of which the step's compute", step_s, "", "");
  std::printf("  %-34s %9.3f %10s %9s\n", "  of which training stalled", stall_s, "", "");
  std::printf("  %-34s %9.3f %10.1f %8.0f%%\n", "load (cold)", load_s, total / load_s / mb, 100 * disk_r / load_s);
  std::printf("  async stall = %.1f%% of the synchronous save\n", 100 * stall_s / sync_s);
  if (o.json) {
    nlohmann::json j = {{"params", engine.num_parameters()}, {"world", world}, {"bytes_per_rank", bytes},
                        {"bytes_total", total}, {"disk_write_s", disk_w}, {"disk_read_s", disk_r},
                        {"disk_write_buffered_s", buffered_w}, {"disk_write_direct_s", direct_w},
                        {"disk_read_buffered_s", buffered_r}, {"disk_read_direct_s", direct_r},
                        {"save_sync_s", sync_s}, {"save_async_s", async_s}, {"async_stall_s", stall_s},
                        {"async_step_s", step_s},
                        {"load_s", load_s}, {"nvme", !o.nvme_path.empty()}, {"param_nvme", o.param_nvme},
                        {"command", command_line()}};
    std::printf("%s\n", j.dump().c_str());
  }
}

}  // namespace

void add_ckpt_command(CLI::App& app) {
  auto o = std::make_shared<CkptOptions>();
  CLI::App* cmd = app.add_subcommand(
      "ckpt", "checkpoint save/load throughput against the disk's sequential speed, and the async-save stall");
  // Ranges checked as the command line is read: a usage error (exit 2).
  cmd->add_option("--layers", o->layers, "GPT layers")->check(tools::at_least<long long>(1))->capture_default_str();
  cmd->add_option("--embd", o->embd, "GPT width")->check(tools::at_least<long long>(1))->capture_default_str();
  cmd->add_option("--heads", o->heads, "attention heads (dividing --embd)")->check(tools::at_least<long long>(1))
      ->capture_default_str();
  cmd->add_option("--stage", o->stage, "ZeRO stage")->check(tools::in_range<int>(0, 3))->capture_default_str();
  cmd->add_flag("!--no-offload", o->offload, "optimizer state on the device instead of offloaded");
  cmd->add_option("--rounds", o->rounds, "rounds (medians are reported)")->check(tools::at_least<long long>(1))
      ->capture_default_str();
  cmd->add_option("--dir", o->dir, "folder to save to (the disk measured; made if its parent exists)")
      ->capture_default_str()
      ->check(tools::non_empty("a folder"));
  cmd->add_flag("--json", o->json, "print one JSON object as the last line");
  cmd->add_option("--nvme-path", o->nvme_path,
                  "the optimizer state on NVMe (offload_optimizer.device \"nvme\") in this folder: the save and "
                  "load stream it between the swap file and the checkpoint")
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--param-nvme", o->param_nvme,
                "with --stage 3 and --nvme-path: the parameter partition on NVMe too (offload_param.device "
                "\"nvme\"), streamed like the state");
  cmd->callback([o] {
    require_heads_divide(o->embd, o->heads);
    if (!o->offload && !o->nvme_path.empty()) {
      throw CLI::ValidationError("--nvme-path", "puts the optimizer state on NVMe, which is offloaded: drop --no-offload");
    }
    // --dir is made by rank 0: a file in its way is said here, by every rank.
    if (const fs::path blocker = tools::file_in_the_way(fs::absolute(o->dir)); !blocker.empty()) {
      throw CLI::ValidationError("--dir", blocker.string() + " is a file, not a folder: give a folder to save to");
    }
    // ... and a folder whose parent is not there is a typo that would
    // measure another disk (the root's): the folder itself may be new.
    std::error_code ec;
    fs::path folder = fs::absolute(o->dir).lexically_normal();
    if (!folder.has_filename()) folder = folder.parent_path();  // "new/" and "new/." name "new"
    const fs::path parent = folder.parent_path();
    if (!fs::is_directory(o->dir, ec) && !fs::is_directory(parent, ec)) {
      throw CLI::ValidationError("--dir", "the folder " + parent.string() + " that would hold " + o->dir +
                                 " is not there: give a folder on the disk to measure (its parent must exist)");
    }
    if (o->param_nvme && (o->stage != 3 || o->nvme_path.empty())) {
      throw CLI::ValidationError("--param-nvme", "puts the parameter partition on NVMe beside the optimizer state: "
                                                 "it needs --stage 3 and --nvme-path");
    }
    run_as_job("zero-bench ckpt", [&](comm::Communicator& job) { run_ckpt_on(*o, job); });
  });
}

}  // namespace zero::bench
