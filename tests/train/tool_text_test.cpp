// The tools' own text handling: a sample made printable, and zero-train's
// record in a checkpoint's client_state checked before it is used.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>

#include "common/option_suggestion.h"
#include "common/printable_text.h"
#include "common/run_record.h"
#include "zero-train/eta.h"
#include "zero-train/progress.h"
#include "zero-train/run_files.h"
#include "zero-train/torch_threads.h"
#include "zero/core/error.h"

namespace {

using zero::tools::printable;

TEST(Eta, DurationsInTwoUnits) {
  using zero::train::format_duration;
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(44.6), "45s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(60), "1m00s");
  EXPECT_EQ(format_duration(12 * 60 + 5), "12m05s");
  EXPECT_EQ(format_duration(3 * 3600 + 7 * 60 + 59), "3h07m");
  EXPECT_EQ(format_duration(2 * 86400 + 4 * 3600 + 1), "2d04h");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "?");
}

TEST(Eta, RateFromTheFirstObservedStep) {
  zero::train::RemainingTime r;
  EXPECT_LT(r.seconds_left(100), 0);  // nothing seen
  // A resumed run starts at step 41; its first step took 30 s (start-up),
  // which the rate leaves out: then 2 s a step.
  r.observe(41, 30.0);
  EXPECT_LT(r.seconds_left(100), 0);  // one step: no rate yet
  r.observe(42, 32.0);
  EXPECT_DOUBLE_EQ(r.seconds_left(100), 58 * 2.0);
  r.observe(51, 50.0);  // steps between prints count, at the same rate
  EXPECT_DOUBLE_EQ(r.seconds_left(100), 49 * 2.0);
  r.observe(100, 148.0);
  EXPECT_DOUBLE_EQ(r.seconds_left(100), 0.0);
  EXPECT_EQ(zero::train::elapsed_and_eta(148.0, r.seconds_left(100)), " elapsed 2m28s eta 0s");
  EXPECT_EQ(zero::train::elapsed_and_eta(30.0, -1.0), " elapsed 30s");
}

// A resume into --out keeps the lines up to the checkpoint's step and
// appends; lines that stop short of it are another run's: moved aside, said.
TEST(RunFiles, AResumeKeepsItsOwnLinesAndMovesAnotherRunsAside) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("zero_run_files_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](int last) {
    std::ofstream m(dir / "metrics.jsonl"), l(dir / "loss.dat"), v(dir / "val.dat");
    for (int k = 1; k <= last; ++k) {
      m << "{\"step\":" << k << ",\"loss\":1.0}\n";
      l << k << " 1.0\n";
    }
  };
  auto lines = [&](const char* name) {
    std::ifstream in(dir / name);
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  {
    write(25);  // this run went past its checkpoint at 20
    zero::train::RunFiles f;
    EXPECT_EQ(f.open(dir, 20), "");
    f.close();
    EXPECT_EQ(lines("metrics.jsonl"), 20);
    EXPECT_EQ(lines("loss.dat"), 20);
    EXPECT_FALSE(fs::exists(dir / "metrics.jsonl.old"));
  }
  {
    write(5);  // another run's 5 steps; the checkpoint is at 20
    zero::train::RunFiles f;
    const std::string said = f.open(dir, 20);
    f.close();
    EXPECT_NE(said.find("held metrics up to step 5 only, not up to the checkpoint's step 20"), std::string::npos)
        << said;
    EXPECT_EQ(lines("metrics.jsonl"), 0);
    EXPECT_EQ(lines("metrics.jsonl.old"), 5);
    EXPECT_EQ(lines("loss.dat.old"), 5);
  }
  fs::remove_all(dir);
}

// The progress line fits the terminal: a wrapped line leaves a row behind
// at every redraw.
TEST(Progress, TheTerminalLineFitsTheColumnsDroppingTheLeastNeededFirst) {
  zero::train::ProgressLine p;
  p.step = 28;
  p.steps = 30;
  p.loss = 3.8149;
  p.val_loss = 3.9;
  p.tokens_per_s = 172699;
  p.tflops = 0.024;
  p.lr = 3.36e-4;
  p.device_bytes = 43930;
  p.host_bytes = 395674;
  const std::string time = " elapsed 12s eta 1s";
  const std::string whole = zero::train::terminal_line(p, time, 1000);
  for (const char* part : {"[#", "28/30 loss 3.8149 val 3.9000", "tok/s", "TFLOP/s", "lr 3.36e-04", "dev ", "eta 1s"}) {
    EXPECT_NE(whole.find(part), std::string::npos) << part << " in " << whole;
  }
  for (int columns : {200, 160, 120, 100, 80, 60, 40, 20, 5, 1}) {
    const std::string line = zero::train::terminal_line(p, time, columns);
    EXPECT_LE(line.size(), static_cast<std::size_t>(std::max(0, columns - 1))) << columns << ": " << line;
    if (columns >= 40) {
      EXPECT_NE(line.find("28/30 loss 3.8149 val 3.9000"), std::string::npos) << columns << ": " << line;
    }
  }
  const std::string eighty = zero::train::terminal_line(p, time, 80);
  EXPECT_EQ(eighty.find("dev "), std::string::npos) << eighty;  // the bytes go first
  EXPECT_NE(eighty.find("eta 1s"), std::string::npos) << eighty;  // the time stays longest
}

// zero-train's LibTorch threads: --threads, else OMP_NUM_THREADS, else the
// rank's share of its cores (never LibTorch's every core for every rank).
TEST(TorchThreads, FlagThenEnvironmentThenTheRanksShareOfTheCores) {
  using zero::train::choose_torch_threads;
  EXPECT_EQ(choose_torch_threads(3, "5", 16, 8).threads, 3);
  EXPECT_EQ(choose_torch_threads(3, "5", 16, 8).why, "--threads");
  EXPECT_EQ(choose_torch_threads(0, "5", 16, 8).threads, 5);
  EXPECT_EQ(choose_torch_threads(0, "5", 16, 8).why, "OMP_NUM_THREADS");
  EXPECT_EQ(choose_torch_threads(0, nullptr, 16, 8).threads, 2);
  EXPECT_EQ(choose_torch_threads(0, nullptr, 16, 8).why, "16 cores this process may run on / 8 ranks on this node");
  EXPECT_EQ(choose_torch_threads(0, nullptr, 2, 1).threads, 2);
  EXPECT_EQ(choose_torch_threads(0, nullptr, 2, 4).threads, 1);  // oversubscribed: one each
  EXPECT_EQ(choose_torch_threads(0, nullptr, 15, 2).threads, 7);
  EXPECT_TRUE(choose_torch_threads(0, nullptr, 2, 1).warning.empty());
  for (const char* bad : {"0", "-1", "abc", "", "2x", " 2"}) {
    const zero::train::ThreadChoice c = choose_torch_threads(0, bad, 4, 2);
    EXPECT_EQ(c.threads, 2) << bad;
    EXPECT_NE(c.warning.find("is not a number of threads"), std::string::npos) << bad;
  }
}

TEST(OptionSuggestion, TyposSpellingsAndBeginningsFindTheOption) {
  using zero::tools::nearest_option;
  const std::vector<std::string> names{"--steps", "--save-every", "--save-dir", "--seed", "--seq-len", "-h", "--help",
                                       "--checkpoint-activations", "--eval-every", "--eval-batches"};
  EXPECT_EQ(nearest_option("--stpes", names), "--steps");          // two letters swapped
  EXPECT_EQ(nearest_option("--step", names), "--steps");           // one left out
  EXPECT_EQ(nearest_option("--save_every", names), "--save-every");  // Python's spelling
  EXPECT_EQ(nearest_option("--Save-Every=5", names), "--save-every");
  EXPECT_EQ(nearest_option("--checkpoint", names), "--checkpoint-activations");  // the one it begins
  EXPECT_EQ(nearest_option("--eval-evry", names), "--eval-every");
  EXPECT_EQ(nearest_option("-help", names), "--help");
  EXPECT_EQ(nearest_option("--sed", names), "--seed");
  // Nothing near, or two names as near: no guess.
  EXPECT_EQ(nearest_option("--learning-rate", names), std::nullopt);
  EXPECT_EQ(nearest_option("--save", names), std::nullopt);  // --save-every and --save-dir begin with it
  EXPECT_EQ(nearest_option("--eval", names), std::nullopt);
  EXPECT_EQ(nearest_option("--", names), std::nullopt);
  EXPECT_EQ(nearest_option("--x", names), std::nullopt);
  EXPECT_EQ(nearest_option("--tap", {"--tag", "--tab"}), std::nullopt);  // one letter from each
  EXPECT_EQ(nearest_option("--tap", {"--tag", "--tab", "--tape"}), std::nullopt);
}

TEST(OptionSuggestion, AToolsUnknownOptionsAreEachSaidWithTheNearOne) {
  CLI::App app{"probe"};
  std::int64_t steps = 0;
  std::string tag;
  app.add_option("--steps", steps);
  CLI::App* inspect = app.add_subcommand("inspect");
  inspect->add_option("--tag", tag);
  inspect->add_option("--threads", steps);
  const auto said = [&app](std::vector<std::string> words) {
    std::vector<char*> argv{const_cast<char*>("probe")};
    for (std::string& word : words) argv.push_back(word.data());
    testing::internal::CaptureStderr();
    bool near = false;
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      near = zero::tools::say_near_options("probe", app, e);
    }
    const std::string text = testing::internal::GetCapturedStderr();
    app.clear();
    return std::make_pair(near, text);
  };
  auto [near, text] = said({"stray", "--stpes", "3", "--bogus-flag", "--steps=2"});
  EXPECT_TRUE(near);
  EXPECT_NE(text.find("probe: unknown option --stpes: did you mean --steps?\n"), std::string::npos) << text;
  EXPECT_NE(text.find("probe: unknown option --bogus-flag\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("'3'"), std::string::npos) << text;  // --stpes's value
  EXPECT_NE(text.find("probe: unexpected argument 'stray'\n"), std::string::npos) << text;
  // A subcommand's options count where it was given.
  std::tie(near, text) = said({"inspect", "--tga", "x"});
  EXPECT_TRUE(near);
  EXPECT_NE(text.find("probe: unknown option --tga: did you mean --tag?"), std::string::npos) << text;
  // Nothing near, and errors other than unexpected arguments: CLI11's own message.
  std::tie(near, text) = said({"--completely-different"});
  EXPECT_FALSE(near);
  EXPECT_EQ(text, "");
  std::tie(near, text) = said({"--steps", "many"});
  EXPECT_FALSE(near);
}

TEST(Printable, KeepsUtf8AndEscapesControlsAndNonUtf8) {
  // ASCII, newline and tab, 2-, 3- and 4-byte UTF-8 stay as they are.
  const std::string utf8 = "a b\n\tc h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9d\x84\x9e";
  EXPECT_EQ(printable(utf8), utf8);
  EXPECT_EQ(printable("\x1b[2J\x07\x7f"), "\\x1b[2J\\x07\\x7f");
  // A lone continuation byte and a lead byte of nothing.
  EXPECT_EQ(printable("x\x9ey\xffz"), "x\\x9ey\\xffz");
  // C1 controls (U+0080..U+009F, as UTF-8) are controls too.
  EXPECT_EQ(printable("\xc2\x85"), "\\xc2\\x85");
  EXPECT_EQ(printable("\xc2\xa0"), "\xc2\xa0");  // U+00A0 is not
  // Overlong forms, a surrogate, a code point past U+10FFFF.
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(printable("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  // A sequence cut short, at the end and before ASCII: the ASCII stays.
  EXPECT_EQ(printable("\xe2\x9c"), "\\xe2\\x9c");
  EXPECT_EQ(printable("\xe2\x9cok"), "\\xe2\\x9cok");
}

std::string error_of(const nlohmann::json& cs) {
  try {
    zero::tools::check_run_record(cs, "ck/step-6");
  } catch (const zero::Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunRecord, WhatZeroTrainWritesPasses) {
  const nlohmann::json cs = {{"step", 6}, {"seed", 1234u}, {"model", "gpt2-tiny"}, {"seq_len", 0}, {"steps", 8},
                             {"corpus", {{"bytes", 10}}}, {"lr", 3e-4}, {"weight_decay", 0.1}, {"decay", "all"}, {"train_batch_size", 8},
                             {"gpt", {{"vocab_size", 256}, {"block_size", 64}, {"n_layer", 2}, {"n_head", 2},
                                      {"n_embd", 64}}}};
  EXPECT_EQ(error_of(cs), "");
  // Older checkpoints, and a library user's own client_state, lack fields.
  EXPECT_EQ(error_of(nlohmann::json::object()), "");
  EXPECT_EQ(error_of({{"step", 3}, {"mine", "x"}}), "");
  EXPECT_EQ(error_of(nlohmann::json()), "");
}

TEST(RunRecord, ValuesZeroTrainNeverWritesAreNamed) {
  EXPECT_NE(error_of({{"step", -5}}).find("checkpoint ck/step-6: its manifest's client_state.step is -5, not a step "
                                          "(an integer >= 0) as zero-train writes it: the manifest was edited"),
            std::string::npos)
      << error_of({{"step", -5}});
  EXPECT_NE(error_of({{"step", 2.5}}).find("client_state.step is 2.5"), std::string::npos);
  EXPECT_NE(error_of({{"gpt", {{"n_head", 0}}}}).find("client_state.gpt.n_head is 0, not a size"), std::string::npos);
  EXPECT_NE(error_of({{"gpt", {{"n_layer", "two"}}}}).find("client_state.gpt.n_layer is \"two\""), std::string::npos);
  EXPECT_NE(error_of({{"gpt", 3}}).find("client_state.gpt is 3"), std::string::npos);
  EXPECT_NE(error_of({{"seed", -1}}).find("client_state.seed is -1"), std::string::npos);
  EXPECT_NE(error_of({{"lr", "1e-3"}}).find("client_state.lr is \"1e-3\""), std::string::npos);
  EXPECT_NE(error_of({{"weight_decay", -0.1}}).find("client_state.weight_decay is -0.1"), std::string::npos);
  EXPECT_NE(error_of({{"train_batch_size", 0}}).find("client_state.train_batch_size is 0"), std::string::npos);
  EXPECT_NE(error_of({{"decay", 1}}).find("client_state.decay is 1, not a string"), std::string::npos);
  EXPECT_NE(error_of({{"steps", 18446744073709551615u}}).find("client_state.steps is 18446744073709551615"),
            std::string::npos);
}

}  // namespace
