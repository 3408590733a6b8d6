// The parts of failure handling that need no job: the flight recorder, the
// divergence diagnosis, the record exchange format, and the config keys.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "zero/comm/comm_errors.h"
#include "zero/comm/flight_recorder.h"
#include "zero/comm/health_channel.h"
#include "zero/comm/sequence_divergence.h"
#include "zero/config/config.h"

namespace {

using zero::DType;
using zero::comm::CollectiveKind;
using zero::comm::FlightRecord;
using zero::comm::FlightRecorder;
using zero::comm::OpSignature;
using zero::comm::OpState;
using zero::comm::ReduceOp;

OpSignature ar(std::uint64_t count, ReduceOp op = ReduceOp::kSum, DType dtype = DType::kFloat32) {
  return {CollectiveKind::kAllReduce, op, dtype, count, -1};
}
OpSignature rs(std::uint64_t count) { return {CollectiveKind::kReduceScatter, ReduceOp::kSum, DType::kBFloat16, count, -1}; }
OpSignature bc(std::uint64_t count, int root) { return {CollectiveKind::kBroadcast, ReduceOp::kSum, DType::kFloat32, count, root}; }
OpSignature ag(std::uint64_t count, std::uint32_t tag) {
  return {CollectiveKind::kAllGather, ReduceOp::kSum, DType::kFloat32, count, -1, tag};
}

FlightRecord record_of(const std::vector<OpSignature>& ops, std::size_t capacity = 64) {
  FlightRecorder r(capacity);
  for (const OpSignature& s : ops) r.finish(r.issue(s, 8), OpState::kCompleted);
  return r.snapshot();
}

TEST(FlightRecorder, KeepsTheLastOpsWithTheirStateInOrder) {
  FlightRecorder r(4);
  for (std::uint64_t i = 0; i < 6; ++i) EXPECT_EQ(r.issue(ar(i + 1), 10 * i), i);
  r.finish(4, OpState::kCompleted);
  r.finish(5, OpState::kTimedOut);
  r.finish(1, OpState::kCompleted);  // no longer kept: ignored
  r.finish(4, OpState::kFailed);     // already final: ignored
  const FlightRecord s = r.snapshot();
  EXPECT_EQ(s.issued, 6u);
  ASSERT_EQ(s.records.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(s.records[i].seq, i + 2);
    EXPECT_EQ(s.records[i].sig.count, i + 3);
  }
  EXPECT_EQ(s.records[0].state, OpState::kIssued);
  EXPECT_EQ(s.records[2].state, OpState::kCompleted);
  EXPECT_EQ(s.records[3].state, OpState::kTimedOut);
  EXPECT_FALSE(r.find(1).has_value());
  ASSERT_TRUE(r.find(5).has_value());
  EXPECT_EQ(r.find(5)->bytes, 50u);
  EXPECT_EQ(r.tail(2).records.front().seq, 4u);
  r.set_capacity(2);
  EXPECT_EQ(r.snapshot().records.front().seq, 4u);
  const std::string text = r.format(3, 4, "a test");
  EXPECT_NE(text.find("rank: 3 of 4"), std::string::npos) << text;
  EXPECT_NE(text.find("#5 all_reduce sum fp32 x 6 (50 B sent), timed out"), std::string::npos) << text;
}

TEST(FlightRecorder, HashDependsOnEveryPartOfTheSignatureAndTheOrder) {
  const std::uint64_t base = record_of({ar(4), rs(8)}).hash;
  EXPECT_EQ(record_of({ar(4), rs(8)}).hash, base);
  EXPECT_NE(record_of({rs(8), ar(4)}).hash, base);
  EXPECT_NE(record_of({ar(5), rs(8)}).hash, base);
  EXPECT_NE(record_of({ar(4, ReduceOp::kMax), rs(8)}).hash, base);
  EXPECT_NE(record_of({ar(4, ReduceOp::kSum, DType::kFloat16), rs(8)}).hash, base);
  EXPECT_NE(record_of({bc(4, 0)}).hash, record_of({bc(4, 1)}).hash);
  EXPECT_NE(record_of({ag(4, 1), ag(4, 2)}).hash, record_of({ag(4, 2), ag(4, 1)}).hash);
  EXPECT_NE(record_of({ag(4, 0)}).hash, record_of({ag(4, 1)}).hash);
  EXPECT_EQ(zero::comm::describe(ag(4, 3)), "all_gather fp32 x 4 per rank, tag 3");
  EXPECT_EQ(zero::comm::describe(ag(4, 0)), "all_gather fp32 x 4 per rank");
}

// A timeout or a failed op catches the ranks at different points of their
// sequences: a rank that has not got as far is no divergence, two ranks that
// issued the same op number differently are.
TEST(SequenceDivergence, IssuedDivergenceIgnoresRanksThatAreBehind) {
  const FlightRecord ahead = record_of({ar(4), ag(8, 1), ag(8, 2), rs(3)});
  const FlightRecord behind = record_of({ar(4), ag(8, 1)});
  EXPECT_EQ(zero::comm::find_issued_divergence({ahead, behind, ahead}).text, "");
  EXPECT_EQ(zero::comm::find_issued_divergence({ahead}).text, "");
  const FlightRecord swapped = record_of({ar(4), ag(8, 2), ag(8, 1)});
  const auto d = zero::comm::find_issued_divergence({ahead, behind, swapped, ahead});
  EXPECT_EQ(d.text,
            "the ranks' collective sequences diverge at op #1: ranks 0, 1, 3 issued all_gather fp32 x 8 per "
            "rank, tag 1; rank 2 issued all_gather fp32 x 8 per rank, tag 2");
  // A rank that asked before rank 1 had issued op #1 names fewer ranks on a
  // side, and the same key: the job prints the divergence once.
  const FlightRecord before_one = record_of({ar(4)});
  const auto early = zero::comm::find_issued_divergence({ahead, before_one, swapped, ahead});
  EXPECT_NE(early.text, d.text);
  EXPECT_EQ(early.key, d.key);
  EXPECT_EQ(d.key, "op #1: [all_gather fp32 x 8 per rank, tag 1] [all_gather fp32 x 8 per rank, tag 2]");
  // Only ops every rank still records are compared.
  FlightRecord short_memory = record_of({ar(4), ag(8, 1), ag(8, 2), rs(3)}, 1);
  EXPECT_EQ(zero::comm::find_issued_divergence({short_memory, swapped}).text, "");
}

TEST(SequenceDivergence, SameSequencesAgree) {
  const FlightRecord a = record_of({ar(4), rs(8), bc(3, 0)});
  EXPECT_EQ(zero::comm::find_divergence({a, a, a}), "");
  EXPECT_EQ(zero::comm::find_divergence({a}), "");
}

TEST(SequenceDivergence, NamesTheFirstDifferentOpAndEachGroup) {
  const FlightRecord good = record_of({ar(4), rs(8), ar(4), bc(3, 0)});
  const FlightRecord bad = record_of({ar(4), rs(8), ar(4, ReduceOp::kMax), bc(3, 0)});
  const std::string d = zero::comm::find_divergence({good, good, bad, good});
  EXPECT_EQ(d, "the ranks' collective sequences diverge at op #2: ranks 0, 1, 3 issued all_reduce sum fp32 x 4; "
               "rank 2 issued all_reduce max fp32 x 4");
}

TEST(SequenceDivergence, NamesARankThatIssuedFewerOps) {
  const FlightRecord full = record_of({ar(4), rs(8), ar(4)});
  const FlightRecord shorter = record_of({ar(4), rs(8)});
  EXPECT_EQ(zero::comm::find_divergence({full, shorter, full}),
            "the ranks' collective sequences diverge at op #2: ranks 0, 2 issued all_reduce sum fp32 x 4; rank 1 "
            "has not issued it (2 ops issued)");
}

TEST(SequenceDivergence, SaysWhenTheDifferenceIsOlderThanTheRecords) {
  std::vector<OpSignature> a{ar(1)}, b{ar(2)};
  for (int i = 0; i < 10; ++i) {
    a.push_back(rs(8));
    b.push_back(rs(8));
  }
  const std::string d = zero::comm::find_divergence({record_of(a, 4), record_of(b, 4)});
  EXPECT_NE(d.find("diverged earlier"), std::string::npos) << d;
  EXPECT_NE(d.find("from op #7"), std::string::npos) << d;
}

TEST(SequenceDivergence, FormatsRankLists) {
  EXPECT_EQ(zero::comm::format_ranks({3}), "rank 3");
  EXPECT_EQ(zero::comm::format_ranks({3, 0, 1}), "ranks 0, 1, 3");
  EXPECT_EQ(zero::comm::format_ranks({0, 1, 2, 3, 4, 5, 7}), "ranks 0-5, 7");
}

TEST(HealthChannel, FlightRecordsSurviveTheWireAndGarbageIsAnError) {
  const FlightRecord a = record_of({ar(4), rs(8), bc(3, 1)});
  const FlightRecord b = zero::comm::parse_flight_record(zero::comm::serialize(a));
  EXPECT_EQ(b.issued, a.issued);
  EXPECT_EQ(b.hash, a.hash);
  ASSERT_EQ(b.records.size(), 3u);
  EXPECT_EQ(b.records[2].sig, a.records[2].sig);
  std::string blob = zero::comm::serialize(a);
  blob.pop_back();
  EXPECT_THROW(zero::comm::parse_flight_record(blob), zero::Error);
  EXPECT_THROW(zero::comm::parse_flight_record("abc"), zero::Error);
}

TEST(FailureConfig, DefaultsKeysAndBadValues) {
  const auto c = zero::config::parse_config("{\"train_batch_size\": 4}", 1);
  EXPECT_EQ(c.comm_timeout, 600.0);
  EXPECT_TRUE(c.comm_sequence_check);
  EXPECT_EQ(c.nonfinite.policy, "skip");
  EXPECT_EQ(c.flight_recorder.entries, 1024);
  const auto d = zero::config::parse_config(
      "{\"train_batch_size\": 4, \"comm_timeout\": 2.5, \"comm_sequence_check\": false, \"nonfinite\": {\"policy\": "
      "\"stop\", \"stop_after\": 3}, \"flight_recorder\": {\"entries\": 16, \"dir\": \"/x\"}}",
      1);
  EXPECT_EQ(d.comm_timeout, 2.5);
  EXPECT_FALSE(d.comm_sequence_check);
  EXPECT_EQ(d.nonfinite.policy, "stop");
  EXPECT_EQ(d.nonfinite.stop_after, 3);
  EXPECT_EQ(d.flight_recorder.entries, 16);
  EXPECT_EQ(d.flight_recorder.dir, "/x");
  EXPECT_EQ(zero::config::parse_config(zero::config::to_json(d).dump(), 1).nonfinite, d.nonfinite);
  for (const char* bad : {"\"comm_timeout\": 0", "\"comm_timeout\": -1", "\"comm_timeout\": \"10\"",
                          "\"nonfinite\": {\"policy\": \"ignore\"}", "\"nonfinite\": {\"stop_after\": 0}",
                          "\"flight_recorder\": {\"entries\": 0}"}) {
    const std::string json = std::string("{\"train_batch_size\": 4, ") + bad + "}";
    try {
      zero::config::parse_config(json, 1);
      ADD_FAILURE() << json << " was accepted";
    } catch (const zero::Error& e) {
      const std::string key = std::string(bad).substr(1, std::string(bad).find('"', 1) - 1);
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  const auto w = zero::config::parse_config("{\"train_batch_size\": 4, \"nonfinite\": {\"polcy\": \"stop\"}}", 1);
  ASSERT_FALSE(w.warnings.empty());
  EXPECT_NE(w.warnings[0].find("polcy"), std::string::npos) << w.warnings[0];
}

TEST(CommErrors, KeysGroupTheSameFailure) {
  const zero::comm::CollectiveTimeout t("rank 0 says", 57);
  EXPECT_EQ(t.key(), "timeout #57");
  const zero::comm::RemoteFailure r("stopping", 2);
  EXPECT_EQ(r.origin_rank(), 2);
  EXPECT_EQ(zero::comm::CollectiveFailed("rank 1 says", 9).key(), "failed #9");
  // Found by each rank while its own op failed: worded per rank, keyed alike.
  EXPECT_EQ(zero::comm::SequenceMismatch("rank 0 found: X", "X").key(),
            zero::comm::SequenceMismatch("rank 3 found: X", "X").key());
}

}  // namespace
