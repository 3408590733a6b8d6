// zero-comm-selftest: checks and times every collective of the communicator
// make_communicator() picks (MPI under mpirun/srun, single-process alone).
//
//   mpirun -np 4 --oversubscribe --bind-to none zero-comm-selftest [--size N] [--iters K]
//
// For each op and dtype it first checks one result against a closed form of
// rank and world size (values are small integers, so sums are exact for up to
// 256 ranks in bf16), then times K iterations and prints, like nccl-tests:
//   time   the slowest rank's mean time per op
//   algbw  S / time, S = the op's buffer size in bytes (all_reduce and
//          broadcast: count; reduce_scatter: its input; all_gather: its output)
//   busbw  algbw * 2(N-1)/N (all_reduce), (N-1)/N (reduce_scatter,
//          all_gather), 1 (broadcast): comparable across N with link speed
//   counted  the bytes per op the communicator's counters report (the ring
//          convention of comm_stats.h)
// Exit code: 0 when every check passed on every rank, 1 otherwise, 2 on a
// usage error.
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "zero/comm/communicator.h"
#include "zero/core/error.h"
#include "zero/core/half.h"
#include "zero/core/shard.h"

namespace {

using zero::DType;
using zero::comm::CollectiveKind;
using zero::comm::Communicator;
using zero::comm::ReduceOp;

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

struct Args {
  std::size_t size = std::size_t{1} << 20;  // elements
  int iters = 20;
};

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: zero-comm-selftest [--size N] [--iters K]\n"
               "  --size N   elements per op (default 1M); K, M, G suffixes are powers of 1024\n"
               "  --iters K  timed iterations per op and dtype (default 20)\n"
               "Run alone (single-process backend) or under mpirun/srun (MPI backend).\n");
}

std::size_t parse_size(std::string_view text) {
  const std::string given(text);
  std::size_t multiplier = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        multiplier = std::size_t{1} << 10;
        break;
      case 'M':
      case 'm':
        multiplier = std::size_t{1} << 20;
        break;
      case 'G':
      case 'g':
        multiplier = std::size_t{1} << 30;
        break;
      default:
        break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  const std::string digits(text);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), &end, 10);
  ZERO_CHECK(!digits.empty() && *end == '\0' && digits[0] != '-',
             "--size expects a number of elements such as 1000 or 4M, got '", text, "'");
  // (The buffers hold several copies of it: 2^40 elements is 4 TiB each.)
  constexpr unsigned long long kMostElements = 1ULL << 40;
  ZERO_CHECK(errno != ERANGE && v <= kMostElements / multiplier, "--size ", given, " is more elements than a host holds (at most 2^40 = ", kMostElements, "): give a smaller --size");
  return static_cast<std::size_t>(v) * multiplier;
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      print_usage(stdout);
      std::exit(0);
    }
    ZERO_CHECK(a == "--size" || a == "--iters", "unknown argument '", a, "' (see --help)");
    ZERO_CHECK(i + 1 < argc, a, " needs a value");
    const std::string_view v = argv[++i];
    if (a == "--size") {
      args.size = parse_size(v);
    } else {
      const int k = std::atoi(std::string(v).c_str());
      ZERO_CHECK(k >= 1, "--iters must be a positive integer, got '", v, "'");
      args.iters = k;
    }
  }
  return args;
}

// A flat buffer of one dtype, written and read as floats.
class Buffer {
 public:
  Buffer(DType dtype, std::size_t n) : dtype_(dtype), bytes_(n * zero::element_size(dtype)) {}
  void* data() { return bytes_.empty() ? nullptr : bytes_.data(); }
  void* at(std::size_t i) { return bytes_.data() + i * zero::element_size(dtype_); }
  void set(std::size_t i, float v) {
    unsigned char* p = bytes_.data() + i * zero::element_size(dtype_);
    if (dtype_ == DType::kFloat32) {
      std::memcpy(p, &v, 4);
    } else {
      const std::uint16_t h =
          dtype_ == DType::kBFloat16 ? zero::float_to_bf16(v) : zero::float_to_fp16(v);
      std::memcpy(p, &h, 2);
    }
  }
  float get(std::size_t i) const {
    const unsigned char* p = bytes_.data() + i * zero::element_size(dtype_);
    if (dtype_ == DType::kFloat32) {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return dtype_ == DType::kBFloat16 ? zero::bf16_to_float(h) : zero::fp16_to_float(h);
  }

 private:
  DType dtype_;
  std::vector<unsigned char> bytes_;
};

// Closed forms. c cycles -1, 0, 1 over consecutive ranks, so the sum over
// ranks 0..N-1 is the sum of the first N % 3 terms (whole cycles add 0).
float c(int r, std::size_t i) {
  return static_cast<float>(static_cast<int>((i + static_cast<std::size_t>(r)) % 3) - 1);
}
float sum_c(int n, std::size_t i) {
  float s = 0;
  for (int r = 0; r < n % 3; ++r) s += c(r, i);
  return s;
}
// For max: 3r mod 11 takes every residue once r reaches 11 ranks.
float m(int r, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3) % 11) - 5);
}
float max_m(int n, std::size_t i) {
  float best = m(0, i);
  for (int r = 1; r < std::min(n, 11); ++r) best = std::max(best, m(r, i));
  return best;
}
float bcast_value(std::size_t i) { return static_cast<float>(static_cast<int>(i % 5) - 2); }

// One op of one dtype: prepares buffers, issues the op, checks the result.
struct Case {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::size_t count = 0;   // the op's count argument
  double algbw_bytes = 0;  // S of nccl-tests
  std::function<void()> fill;
  std::function<zero::comm::WorkPtr()> issue;
  std::function<std::size_t()> mismatches;
};

Case make_case(Communicator& comm, CollectiveKind kind, DType dtype, ReduceOp op, std::size_t size,
               std::vector<Buffer>& storage) {
  const int r = comm.rank(), n = comm.world_size();
  const zero::ShardInfo s = zero::shard_of(size, n, r);
  const double es = static_cast<double>(zero::element_size(dtype));
  Case cs;
  cs.kind = kind;
  cs.dtype = dtype;
  cs.op = op;
  storage.clear();
  switch (kind) {
    case CollectiveKind::kAllReduce: {
      Buffer& buf = storage.emplace_back(dtype, size);
      cs.count = size;
      cs.algbw_bytes = static_cast<double>(size) * es;
      cs.fill = [&buf, size, r, op] {
        for (std::size_t i = 0; i < size; ++i) buf.set(i, op == ReduceOp::kSum ? c(r, i) : m(r, i));
      };
      cs.issue = [&comm, &buf, size, dtype, op] {
        return comm.all_reduce(buf.data(), size, dtype, {op});
      };
      cs.mismatches = [&buf, size, n, op] {
        std::size_t bad = 0;
        for (std::size_t i = 0; i < size; ++i)
          bad += buf.get(i) != (op == ReduceOp::kSum ? sum_c(n, i) : max_m(n, i));
        return bad;
      };
      break;
    }
    case CollectiveKind::kReduceScatter: {
      // In place on a padded buffer, as ZeRO's gradient partitioning does.
      Buffer& buf = storage.emplace_back(dtype, s.padded_numel);
      cs.count = s.per_rank;
      cs.algbw_bytes = static_cast<double>(s.padded_numel) * es;
      cs.fill = [&buf, s, r, op] {
        for (std::size_t i = 0; i < s.padded_numel; ++i) {
          buf.set(i, i >= s.numel ? 0.0f : (op == ReduceOp::kSum ? c(r, i) : m(r, i)));
        }
      };
      cs.issue = [&comm, &buf, s, dtype, op] {
        return comm.reduce_scatter(buf.data(), s.per_rank == 0 ? nullptr : buf.at(s.offset),
                                   s.per_rank, dtype, {op});
      };
      cs.mismatches = [&buf, s, n, op] {
        std::size_t bad = 0;
        for (std::size_t k = s.offset; k < s.offset + s.per_rank; ++k) {
          const float want =
              k >= s.numel ? 0.0f : (op == ReduceOp::kSum ? sum_c(n, k) : max_m(n, k));
          bad += buf.get(k) != want;
        }
        return bad;
      };
      break;
    }
    case CollectiveKind::kAllGather: {
      Buffer& buf = storage.emplace_back(dtype, s.padded_numel);
      cs.count = s.per_rank;
      cs.algbw_bytes = static_cast<double>(s.padded_numel) * es;
      cs.fill = [&buf, s, r] {
        for (std::size_t k = 0; k < s.padded_numel; ++k) buf.set(k, 9.0f);  // others' slots
        for (std::size_t k = s.offset; k < s.offset + s.per_rank; ++k)
          buf.set(k, k < s.numel ? c(r, k) : 0.0f);
      };
      cs.issue = [&comm, &buf, s, dtype] {
        return comm.all_gather(s.per_rank == 0 ? nullptr : buf.at(s.offset), buf.data(), s.per_rank,
                               dtype);
      };
      cs.mismatches = [&buf, s] {
        std::size_t bad = 0;
        for (std::size_t k = 0; k < s.padded_numel; ++k) {
          const int owner = static_cast<int>(k / s.per_rank);
          bad += buf.get(k) != (k < s.numel ? c(owner, k) : 0.0f);
        }
        return bad;
      };
      break;
    }
    case CollectiveKind::kBroadcast: {
      Buffer& buf = storage.emplace_back(dtype, size);
      cs.count = size;
      cs.algbw_bytes = static_cast<double>(size) * es;
      cs.fill = [&buf, size, r] {
        for (std::size_t i = 0; i < size; ++i) buf.set(i, r == 0 ? bcast_value(i) : 7.0f);
      };
      cs.issue = [&comm, &buf, size, dtype] {
        return comm.broadcast(buf.data(), size, dtype, {0});
      };
      cs.mismatches = [&buf, size] {
        std::size_t bad = 0;
        for (std::size_t i = 0; i < size; ++i) bad += buf.get(i) != bcast_value(i);
        return bad;
      };
      break;
    }
    case CollectiveKind::kBarrier:
      break;
  }
  return cs;
}

double bus_factor(CollectiveKind kind, int n) {
  const double nn = n;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2.0 * (nn - 1) / nn;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
      return (nn - 1) / nn;
    default:
      return 1.0;
  }
}

// The slowest rank's value, which is what an op costs the whole job.
double max_over_ranks(Communicator& comm, double v) {
  float x = static_cast<float>(v);
  comm.all_reduce(&x, 1, DType::kFloat32, {ReduceOp::kMax})->wait();
  return x;
}

int run(const Args& args) {
  auto comm = zero::comm::make_communicator();
  const int rank = comm->rank(), n = comm->world_size();
  const bool print = rank == 0;
  if (print) {
    std::printf(
        "zero-comm-selftest: backend %s, world size %d, %zu elements per op, %d iterations\n",
        comm->backend_name().c_str(), n, args.size, args.iters);
  }
  // Every rank must test the same sizes: ranks given another --size or
  // --iters would issue collectives that do not match (Open MPI 4.1 then
  // crashes in a double free and the others wait forever).
  {
    const auto chunks = [](std::uint64_t v) {  // (20 bits each: exact in a float)
      return std::array<float, 3>{float(v & 0xFFFFF), float((v >> 20) & 0xFFFFF), float(v >> 40)};
    };
    const auto sz = chunks(args.size), it = chunks(static_cast<std::uint64_t>(args.iters));
    std::array<float, 12> x{};
    for (int i = 0; i < 3; ++i) {
      x[i] = sz[i];
      x[3 + i] = -sz[i];
      x[6 + i] = it[i];
      x[9 + i] = -it[i];
    }
    comm->all_reduce(x.data(), x.size(), DType::kFloat32, {ReduceOp::kMax})->wait();
    bool same = true;
    for (int i = 0; i < 3; ++i) same = same && x[i] == -x[3 + i] && x[6 + i] == -x[9 + i];
    ZERO_CHECK(same, "the ranks were given different --size or --iters (rank ", rank, ": --size ", args.size,
               " --iters ", args.iters, "): give every rank the same arguments");
  }
  std::uint64_t failures = 0;
  std::vector<Buffer> storage;
  for (CollectiveKind kind : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                              CollectiveKind::kAllGather, CollectiveKind::kBroadcast}) {
    const bool reduces =
        kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
    if (print) {
      std::printf("\n%s\n%-5s %-4s %12s %14s %11s %11s %11s %14s  %s\n",
                  std::string(zero::comm::collective_name(kind)).c_str(), "dtype", "op", "count",
                  "size_B", "time_us", "algbw_GB/s", "busbw_GB/s", "counted_B", "check");
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      if (op == ReduceOp::kMax && !reduces) continue;
      for (DType dtype : kDTypes) {
        Case cs = make_case(*comm, kind, dtype, op, args.size, storage);
        // Check once, before timing (nccl-tests' -c): a wrong answer fast is no answer.
        cs.fill();
        comm->reset_stats();
        cs.issue()->wait();
        const std::uint64_t counted = comm->stats().total_bytes();
        const std::size_t bad = cs.mismatches();
        const double bad_anywhere = max_over_ranks(*comm, static_cast<double>(bad));
        failures += bad_anywhere > 0;

        comm->barrier()->wait();
        const auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < args.iters; ++k) cs.issue()->wait();
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        const double seconds = max_over_ranks(*comm, dt.count() / args.iters);
        const double algbw = seconds > 0 ? cs.algbw_bytes / seconds / 1e9 : 0.0;
        if (print) {
          std::printf("%-5s %-4s %12zu %14.0f %11.1f %11.3f %11.3f %14" PRIu64 "  %s\n",
                      std::string(zero::dtype_name(dtype)).c_str(),
                      reduces ? std::string(zero::comm::reduce_op_name(op)).c_str() : "-", cs.count,
                      cs.algbw_bytes, seconds * 1e6, algbw, algbw * bus_factor(kind, n), counted,
                      bad_anywhere > 0 ? "MISMATCH" : "ok");
        }
        if (bad > 0) {
          std::fprintf(stderr,
                       "rank %d: %s %s %s: %zu of %zu elements differ from the closed form\n", rank,
                       std::string(zero::comm::collective_name(kind)).c_str(),
                       std::string(zero::dtype_name(dtype)).c_str(),
                       std::string(zero::comm::reduce_op_name(op)).c_str(), bad, cs.count);
        }
      }
    }
  }
  comm->barrier()->wait();
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < args.iters; ++k) comm->barrier()->wait();
  const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
  const double seconds = max_over_ranks(*comm, dt.count() / args.iters);
  if (print) {
    std::printf("\nbarrier  time_us %.1f\n", seconds * 1e6);
    std::printf("\n%s\n", failures == 0 ? "all checks passed" : "SOME CHECKS FAILED");
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "zero-comm-selftest: %s\n", e.what());
    print_usage(stderr);
    return 2;
  }
  try {
    return run(args);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "zero-comm-selftest: out of memory for the test buffers of --size %zu elements (%zu bytes "
                 "each in fp32): give a smaller --size\n", args.size, args.size * 4);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-comm-selftest: %s\n", e.what());
    return 1;
  }
}
