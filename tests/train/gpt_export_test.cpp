// zero-ckpt's outputs against readers nobody here wrote: a GPT trained by the
// engine on 2 ranks (stage 2 + offload), saved, then
//  - consolidate: every tensor of the safetensors file equals the engine's
//    fp32 master weights bit for bit (read here with a minimal parser, and by
//    the `safetensors` package in the Python check);
//  - export-hf: transformers' GPT2LMHeadModel.from_pretrained(DIR) gives the
//    logits zerocpp's model gives on the same tokens, within fp32 tolerance
//    (tests/train/hf_export_check.py, run with the project's Python).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ops/randint.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/utils.h>

#include "zero/ckpt/checkpoint_dir.h"
#include "zero/comm/communicator.h"
#include "zero/engine/engine.h"
#include "zero/models/gpt.h"

namespace zero {
namespace {

namespace fs = std::filesystem;

comm::Communicator& world() {
  static std::unique_ptr<comm::Communicator> c = comm::make_communicator();
  return *c;
}

void write_floats(const fs::path& p, const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).contiguous();
  std::ofstream(p, std::ios::binary).write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

TEST(GptExport, ConsolidateIsTheMasterWeightsAndHuggingFaceGivesTheSameLogits) {
  comm::Communicator& comm = world();
  models::GptConfig g;
  g.vocab_size = 256;
  g.block_size = 32;
  g.n_layer = 2;
  g.n_head = 4;
  g.n_embd = 64;
  torch::manual_seed(5);
  auto model = std::make_shared<models::Gpt>(g);
  config::Config cfg;
  cfg.train_micro_batch_size_per_gpu = 2;
  cfg.gradient_accumulation_steps = 1;
  cfg.train_batch_size = 2 * comm.world_size();
  cfg.optimizer.type = "AdamW";
  cfg.optimizer.lr = 3e-3f;
  cfg.zero_optimization.stage = 2;
  cfg.zero_optimization.offload_optimizer.device = "cpu";
  cfg.zero_optimization.reduce_bucket_size = 20000;
  Engine engine(model, cfg, comm);
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + step);
    const at::Tensor batch = at::randint(256, {2 * comm.world_size(), 17}).narrow(0, 2 * comm.rank(), 2);
    engine.backward(model->loss(batch.narrow(1, 0, 16), batch.narrow(1, 1, 16)));
    engine.step();
  }
  engine.flush();
  // A folder every rank sees (rank 0's pid).
  float id = comm.rank() == 0 ? static_cast<float>(::getpid() % 1000000) : 0.0f;
  comm.broadcast(&id, 1, DType::kFloat32)->wait();
  const fs::path work = fs::temp_directory_path() / ("zero_gpt_export_" + std::to_string(static_cast<long>(id)));
  engine.save_checkpoint((work / "ck").string(), "step-3",
                         {{"gpt", {{"n_head", g.n_head}, {"n_layer", g.n_layer}, {"n_embd", g.n_embd}}}});
  const std::vector<at::Tensor> master = engine.gather_master_params();
  // zerocpp's logits on fixed tokens (fp32 training: the model computes
  // with the master weights).
  torch::manual_seed(7);
  const at::Tensor tokens = at::randint(256, {2, 16});
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = model->forward(tokens);
  }
  comm.barrier()->wait();
  if (comm.rank() == 0) {
    const std::string tool = ZERO_CKPT_TOOL, python = ZERO_PYTHON, check = ZERO_HF_CHECK;
    ASSERT_EQ(std::system((tool + " consolidate " + (work / "ck").string() + " --out " + (work / "m.safetensors").string()).c_str()), 0);
    ASSERT_EQ(std::system((tool + " export-hf " + (work / "ck").string() + " --out " + (work / "hf").string()).c_str()), 0);
    ASSERT_EQ(std::system((tool + " inspect --verify " + (work / "ck").string() + " > " + (work / "inspect.txt").string()).c_str()), 0);
    // consolidate: the master weights, by name, bitwise (minimal parser:
    // 8-byte header length, JSON header, data).
    std::ifstream in(work / "m.safetensors", std::ios::binary);
    std::uint64_t hlen = 0;
    in.read(reinterpret_cast<char*>(&hlen), 8);
    std::string header(hlen, ' ');
    in.read(header.data(), static_cast<std::streamsize>(hlen));
    const nlohmann::json h = nlohmann::json::parse(header);
    std::size_t i = 0;
    for (const auto& item : model->named_parameters()) {
      if (i >= master.size()) break;
      const auto& e = h.at(item.key());
      EXPECT_EQ(e.at("dtype"), "F32");
      const auto off = e.at("data_offsets").get<std::vector<std::uint64_t>>();
      ASSERT_EQ(off[1] - off[0], static_cast<std::uint64_t>(master[i].numel() * 4)) << item.key();
      std::vector<float> v(master[i].numel());
      in.seekg(static_cast<std::streamoff>(8 + hlen + off[0]));
      in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
      const at::Tensor m = master[i].contiguous();
      EXPECT_EQ(std::memcmp(v.data(), m.data_ptr<float>(), v.size() * 4), 0) << item.key();
      ++i;
    }
    EXPECT_EQ(i, master.size());
    write_floats(work / "tokens.bin", tokens);
    write_floats(work / "logits.bin", logits);
    const std::string cmd = python + " " + check + " " + work.string() + " 2 16 256";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::error_code ec;
    ckpt::remove_tree(work, ec);
  }
  comm.barrier()->wait();
}

}  // namespace
}  // namespace zero
