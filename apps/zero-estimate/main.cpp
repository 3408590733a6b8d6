// zero-estimate: what fits where, before you run. Bytes per rank per tier for
// a model (a GPT preset or a parameter count), world size, stage, offload and
// precision, from DESIGN.md's formulas as the engine lays them out
// (zero/memory_estimate.h), plus buckets and the activations of a micro-batch.
// With --device-mem and --host-mem: which configurations fit, best first.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "zero/core/error.h"
#include "zero/memory/memory_ledger.h"
#include "zero/models/gpt.h"
#include "zero/zero/memory_estimate.h"

using namespace zero;

namespace {

std::int64_t parse_count(const std::string& s) {
  ZERO_CHECK(!s.empty(), "empty number");
  std::size_t pos = 0;
  double v = std::stod(s, &pos);
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B' && unit != "B") unit.pop_back();  // "GB" -> "G", "GIB" -> "GI"
  if (!unit.empty() && unit.back() == 'I') unit.pop_back();
  double m = 1;
  if (unit == "K") m = 1024.0; else if (unit == "M") m = 1024.0 * 1024; else if (unit == "G") m = 1024.0 * 1024 * 1024;
  else if (unit == "T") m = 1024.0 * 1024 * 1024 * 1024; else if (unit == "B" || unit.empty()) m = 1;
  else ZERO_CHECK(false, "cannot read '", s, "': use a number with an optional K, M, G or T suffix");
  return static_cast<std::int64_t>(v * m);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "gpt2", params_text, device_mem_text, host_mem_text, precision = "bf16";
  int world = 1, stage = -1;
  bool offload = false, dpu = false, json = false;
  std::int64_t micro = 1, seq = 0, bucket = 500'000'000;
  CLI::App app{"zero-estimate: memory per rank per tier for a ZeRO configuration, and what fits"};
  app.add_option("--model", model, "GPT preset (gpt2-tiny ... gpt2-xl)")->capture_default_str();
  app.add_option("--params", params_text, "parameter count instead of a preset (e.g. 7.5G = 7.5 * 2^30, or 7500000000)");
  app.add_option("--world", world, "data-parallel ranks")->capture_default_str();
  app.add_option("--stage", stage, "ZeRO stage 0-2 (default: all)");
  app.add_flag("--offload", offload, "offload_optimizer.device = cpu");
  app.add_flag("--dpu", dpu, "delayed parameter update (with --offload)");
  app.add_option("--precision", precision, "bf16, fp16 or fp32")->capture_default_str();
  app.add_option("--micro", micro, "micro-batch per rank (activations)")->capture_default_str();
  app.add_option("--seq", seq, "sequence length (default: the preset's context)");
  app.add_option("--bucket", bucket, "reduce_bucket_size in elements")->capture_default_str();
  app.add_option("--device-mem", device_mem_text, "device memory per rank (e.g. 80G); lists what fits");
  app.add_option("--host-mem", host_mem_text, "host memory per rank (e.g. 256G)");
  app.add_flag("--json", json, "also print one JSON object (bytes per configuration) as the last line");
  CLI11_PARSE(app, argc, argv);
  try {
    EstimateInput in;
    in.world = world;
    in.bucket_numel = bucket;
    ZERO_CHECK(precision == "bf16" || precision == "fp16" || precision == "fp32",
               "--precision must be bf16, fp16 or fp32, got '", precision, "'");
    in.element_bytes = precision == "fp32" ? 4 : 2;
    if (!params_text.empty()) {
      in.params = parse_count(params_text);
    } else {
      models::GptConfig g = models::gpt_preset(model);
      in.params = g.num_parameters();
      in.micro_batch = micro;
      in.seq_len = seq > 0 ? seq : g.block_size;
      in.n_layer = g.n_layer;
      in.n_embd = g.n_embd;
      in.n_head = g.n_head;
      in.vocab = g.vocab_size;
    }
    const std::int64_t device_mem = device_mem_text.empty() ? 0 : parse_count(device_mem_text);
    const std::int64_t host_mem = host_mem_text.empty() ? 0 : parse_count(host_mem_text);
    std::printf("%s: %.3fB parameters, %d rank(s), %s%s\n", params_text.empty() ? model.c_str() : "model",
                in.params / 1e9, world, precision.c_str(),
                in.micro_batch ? (", activations of micro-batch " + std::to_string(micro) + " x " + std::to_string(in.seq_len)).c_str() : "");
    std::printf("%-18s %12s %12s %12s %12s | %12s %12s\n", "configuration", "dev states", "dev buckets", "dev activ.",
                "dev total", "host states", "host total");
    struct Row { int stage; bool offload; MemoryEstimate e; bool fits; };
    std::vector<Row> rows;
    // Best first: the least communication and host work that fits.
    const std::vector<std::pair<int, bool>> order = {{0, false}, {1, false}, {2, false}, {1, true}, {2, true}};
    for (auto [s, off] : order) {
      if (stage >= 0 && s != stage) continue;
      if (stage >= 0 && offload != off) continue;
      in.stage = s;
      in.offload = off;
      in.dpu = off && dpu;
      MemoryEstimate e = estimate_memory(in);
      const bool fits = (device_mem == 0 || e.device_total() <= device_mem) && (host_mem == 0 || e.host_total() <= host_mem);
      rows.push_back({s, off, e, fits});
      std::printf("%-18s %12s %12s %12s %12s | %12s %12s%s\n", describe_config(s, off).c_str(),
                  memory::format_bytes(e.device_model_states()).c_str(), memory::format_bytes(e.device_buckets).c_str(),
                  memory::format_bytes(e.device_activations).c_str(), memory::format_bytes(e.device_total()).c_str(),
                  memory::format_bytes(e.host_model_states()).c_str(), memory::format_bytes(e.host_total()).c_str(),
                  (device_mem || host_mem) ? (fits ? "  fits" : "  does not fit") : "");
    }
    if (json) {
      std::printf("{\"params\":%lld,\"world\":%d,\"configs\":[", (long long)in.params, world);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const MemoryEstimate& e = rows[i].e;
        std::printf("%s{\"stage\":%d,\"offload\":%s,\"device_model_states\":%lld,\"host_model_states\":%lld,"
                    "\"device_total\":%lld,\"host_total\":%lld,\"fits\":%s}",
                    i ? "," : "", rows[i].stage, rows[i].offload ? "true" : "false",
                    (long long)e.device_model_states(), (long long)e.host_model_states(), (long long)e.device_total(),
                    (long long)e.host_total(), rows[i].fits ? "true" : "false");
      }
      std::printf("]}\n");
    }
    if (device_mem || host_mem) {
      const Row* best = nullptr;
      for (const Row& r : rows) if (r.fits && !best) best = &r;
      if (best) {
        std::printf("best fit: %s (zero_optimization.stage=%d%s)\n", describe_config(best->stage, best->offload).c_str(),
                    best->stage, best->offload ? ", offload_optimizer.device=\"cpu\"" : "");
      } else {
        std::printf("nothing fits: add ranks (--world), lower the micro-batch, or use more host memory\n");
        return 2;
      }
    }
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "zero-estimate: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-estimate: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
