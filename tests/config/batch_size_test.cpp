// The batch-size triple: train = micro * accumulation * world.
#include "config_test_util.h"

namespace {

using zero::config::testing::error_of;
using zero::config::testing::parse;

struct Triple {
  std::int64_t train, micro, accum;
};

Triple resolved(std::string_view text, int world) {
  auto c = parse(text, world);
  return {c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps};
}

void expect_triple(std::string_view text, int world, Triple want) {
  Triple got = resolved(text, world);
  EXPECT_EQ(got.train, want.train) << text;
  EXPECT_EQ(got.micro, want.micro) << text;
  EXPECT_EQ(got.accum, want.accum) << text;
}

TEST(BatchSize, AccumulationPastWhatTheEngineCountsIsRefused) {
  // 2^31 would wrap to a negative 32-bit count, 2^32 + 1 to 1.
  for (const char* steps : {"2147483648", "4294967297"}) {
    const std::string e = error_of(std::string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )") +
                                       steps + "}",
                                   1);
    EXPECT_NE(e.find("more than the 2147483647 micro-batches per step"), std::string::npos) << e;
  }
  expect_triple(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2147483647})", 1,
                {2147483647, 1, 2147483647});
}

TEST(BatchSize, AllThreeConsistent) {
  expect_triple(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                    "gradient_accumulation_steps": 2})", 4, {32, 4, 2});
}

TEST(BatchSize, TrainAndMicroGiveAccumulation) {
  expect_triple(R"({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 4})", 4, {48, 4, 3});
}

TEST(BatchSize, TrainAndAccumulationGiveMicro) {
  expect_triple(R"({"train_batch_size": 48, "gradient_accumulation_steps": 3})", 2, {48, 8, 3});
}

TEST(BatchSize, MicroAndAccumulationGiveTrain) {
  expect_triple(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3})", 8,
                {96, 4, 3});
}

TEST(BatchSize, TrainAloneMeansNoAccumulation) {
  expect_triple(R"({"train_batch_size": 32})", 8, {32, 4, 1});
}

TEST(BatchSize, MicroAloneMeansNoAccumulation) {
  expect_triple(R"({"train_micro_batch_size_per_gpu": 6})", 3, {18, 6, 1});
}

TEST(BatchSize, SummaryNamesTheFactors) {
  auto c = parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4);
  EXPECT_EQ(c.batch_summary(), "train_batch_size=32 = micro_batch 4 x accumulation 2 x world 4");
  EXPECT_EQ(c.world_size, 4);
}

TEST(BatchSize, InconsistentTriplePrintsAllValuesAndTheFix) {
  std::string e = error_of(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 3})", 4);
  EXPECT_CONTAINS(e, "test.json: batch sizes:");
  EXPECT_CONTAINS(e, "train_batch_size=32");
  EXPECT_CONTAINS(e, "train_micro_batch_size_per_gpu=4");
  EXPECT_CONTAINS(e, "gradient_accumulation_steps=3");
  EXPECT_CONTAINS(e, "world size 4");
  EXPECT_CONTAINS(e, "4 x 3 x 4 = 48");
  EXPECT_CONTAINS(e, "set train_batch_size to 48");
}

TEST(BatchSize, NotDivisibleSaysWhatToMultiply) {
  std::string e = error_of(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})", 4);
  EXPECT_CONTAINS(e, "multiple of train_micro_batch_size_per_gpu x world size = 16");
  EXPECT_CONTAINS(e, "gradient_accumulation_steps=(not given)");
  EXPECT_CONTAINS(e, "world size 4");
  EXPECT_CONTAINS(e, "16 or 32");

  e = error_of(R"({"train_batch_size": 30, "gradient_accumulation_steps": 4})", 2);
  EXPECT_CONTAINS(e, "multiple of gradient_accumulation_steps x world size = 8");

  e = error_of(R"({"train_batch_size": 6})", 4);
  EXPECT_CONTAINS(e, "multiple of the world size = 4");
  EXPECT_CONTAINS(e, "4 or 8");
}

TEST(BatchSize, TrainSmallerThanOneStepFails) {
  // 8 < 4 x 4: not even one accumulation step.
  std::string e = error_of(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4})", 4);
  EXPECT_CONTAINS(e, "multiple of train_micro_batch_size_per_gpu x world size = 16");
  EXPECT_CONTAINS(e, "e.g. 16");
}

TEST(BatchSize, NoneGivenFails) {
  EXPECT_CONTAINS(error_of("{}"), "set train_batch_size or train_micro_batch_size_per_gpu");
  // Accumulation alone does not determine a batch.
  EXPECT_CONTAINS(error_of(R"({"gradient_accumulation_steps": 4})"),
                  "set train_batch_size or train_micro_batch_size_per_gpu");
}

TEST(BatchSize, MustBePositiveIntegers) {
  EXPECT_CONTAINS(error_of(R"({"train_batch_size": 0})"),
                  "test.json: train_batch_size: expected a positive integer, got 0");
  EXPECT_CONTAINS(error_of(R"({"train_micro_batch_size_per_gpu": -2})"),
                  "train_micro_batch_size_per_gpu: expected a positive integer, got -2");
  EXPECT_CONTAINS(error_of(R"({"train_batch_size": 8, "gradient_accumulation_steps": 1.5})"),
                  "gradient_accumulation_steps: expected a positive integer, got 1.5");
  EXPECT_CONTAINS(error_of(R"({"train_batch_size": "8"})"),
                  "train_batch_size: expected a positive integer, got \"8\"");
  // An integral float is an integer (DeepSpeed configs write 5e8 and 8.0).
  expect_triple(R"({"train_batch_size": 8.0})", 1, {8, 8, 1});
}

TEST(BatchSize, OverflowIsAnErrorNotAWrap) {
  std::string e = error_of(R"({"train_micro_batch_size_per_gpu": 4611686018427387904,
                               "gradient_accumulation_steps": 4})");
  EXPECT_CONTAINS(e, "does not fit in 64 bits");
}

TEST(BatchSize, AutoMeansNotGiven) {
  auto c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
                     "gradient_accumulation_steps": "auto"})", 2);
  EXPECT_EQ(c.train_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_CONTAINS(c.warnings[0], "'train_batch_size' is \"auto\"");
}

TEST(BatchSize, WorldSizeMustBePositive) {
  EXPECT_CONTAINS(error_of(R"({"train_batch_size": 8})", 0), "world size");
}

}  // namespace
