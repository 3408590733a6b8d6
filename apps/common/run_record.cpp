#include "common/run_record.h"

#include <cstdint>
#include <limits>

#include "zero/core/error.h"

namespace zero::tools {
namespace {

void fail(const std::string& folder, const std::string& key, const nlohmann::json& value, const char* expected) {
  std::string shown = value.dump();
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  throw Error("checkpoint " + folder + ": its manifest's client_state." + key + " is " + shown + ", not " + expected +
              " as zero-train writes it: the manifest was edited or written by another program; resume from (or "
              "export) another checkpoint");
}

// An integer in [lo, the largest int64].
void check_int(const nlohmann::json& obj, const std::string& folder, const std::string& prefix, const char* key,
               std::int64_t lo, const char* expected) {
  const auto it = obj.find(key);
  if (it == obj.end()) return;
  const bool ok = (it->is_number_unsigned() && it->get<std::uint64_t>() <=
                                                   static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) &&
                   static_cast<std::int64_t>(it->get<std::uint64_t>()) >= lo) ||
                  (it->is_number_integer() && !it->is_number_unsigned() && it->get<std::int64_t>() >= lo);
  if (!ok) fail(folder, prefix + key, *it, expected);
}

}  // namespace

void check_run_record(const nlohmann::json& cs, const std::string& folder) {
  if (!cs.is_object()) return;
  check_int(cs, folder, "", "step", 0, "a step (an integer >= 0)");
  check_int(cs, folder, "", "steps", 1, "a step count (an integer >= 1)");
  check_int(cs, folder, "", "seq_len", 0, "a sequence length (an integer >= 0)");
  check_int(cs, folder, "", "train_batch_size", 1, "a batch size (an integer >= 1)");
  if (const auto it = cs.find("seed"); it != cs.end() && !it->is_number_unsigned() &&
                                       !(it->is_number_integer() && it->get<std::int64_t>() >= 0)) {
    fail(folder, "seed", *it, "a seed (an integer >= 0)");
  }
  for (const char* key : {"lr", "weight_decay"}) {
    if (const auto it = cs.find(key); it != cs.end() && !(it->is_number() && it->get<double>() >= 0.0)) {
      fail(folder, key, *it, "a rate (a number >= 0)");
    }
  }
  for (const char* key : {"model", "decay"}) {
    if (const auto it = cs.find(key); it != cs.end() && !it->is_string()) fail(folder, key, *it, "a string");
  }
  const auto gpt = cs.find("gpt");
  if (gpt == cs.end()) return;
  if (!gpt->is_object()) fail(folder, "gpt", *gpt, "the GPT's shape (an object)");
  for (const char* key : {"vocab_size", "block_size", "n_layer", "n_head", "n_embd"}) {
    check_int(*gpt, folder, "gpt.", key, 1, "a size (an integer >= 1)");
  }
}

}  // namespace zero::tools
