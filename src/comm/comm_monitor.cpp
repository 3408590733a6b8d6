#include "comm_monitor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "zero/comm/sequence_divergence.h"
#include "zero/core/error.h"

namespace zero::comm::detail {
namespace {

// How long a rank waits for the others' watchdogs to answer.
constexpr std::chrono::milliseconds kQueryGrace{3000};
// Records a watchdog sends back when asked.
constexpr std::size_t kQueryRecords = 64;

// A name shared by every rank of one job, for the default dump folder.
std::string job_tag() {
  for (const char* var : {"OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", "PMIX_NAMESPACE"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
      std::string s(v);
      for (char& c : s) {
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
      }
      return s;
    }
  }
  return "pid" + std::to_string(::getpid());
}

std::string default_dump_dir() {
  if (const char* v = std::getenv("ZERO_FLIGHT_RECORDER_DIR"); v != nullptr && *v != '\0') return v;
  const char* tmp = std::getenv("TMPDIR");
  std::string base = (tmp != nullptr && *tmp != '\0') ? tmp : "/tmp";
  return base + "/zerocpp-flight-recorder-" + job_tag();
}

// mkdir -p with plain syscalls (no std::filesystem: see ckpt::remove_tree).
bool make_dirs(const std::string& dir) {
  std::string path;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') path = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    path += part;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return false;
    path += "/";
  }
  return true;
}

// "<folder>/flight-recorder-rank-*.txt" from one rank's dump() result, or
// that result itself where it says why the file was not written.
std::string all_recorders(const std::string& path) {
  if (path.empty() || path[0] == '(') return path;
  return path.substr(0, path.rfind('/') + 1) + "flight-recorder-rank-*.txt";
}

// "collective #12, all_reduce sum fp32 x 4 (24 bytes sent per rank)," (the
// record's part where this rank still keeps it).
std::string name_op(std::uint64_t seq, const std::optional<OpRecord>& r) {
  std::ostringstream os;
  os << "collective #" << seq;
  if (r) os << ", " << describe(r->sig) << " (" << r->bytes << " bytes sent per rank),";
  return os.str();
}

std::string seconds(std::chrono::milliseconds t) {
  std::ostringstream os;
  os << static_cast<double>(t.count()) / 1000.0 << " s";
  return os.str();
}

}  // namespace

void CommMonitor::set_identity(int rank, int world_size) {
  rank_.store(rank);
  world_.store(world_size);
}

void CommMonitor::set_timeout(std::chrono::milliseconds t) {
  ZERO_CHECK(t.count() > 0, "comm_timeout must be positive, got ", t.count(), " ms");
  timeout_ms_.store(t.count(), std::memory_order_relaxed);
}

void CommMonitor::set_dump_dir(std::string dir) {
  std::lock_guard<std::mutex> lock(mu_);
  dump_dir_ = std::move(dir);
}

std::string CommMonitor::dump_path() const {
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = dump_dir_;
  }
  if (dir.empty()) dir = default_dump_dir();
  char name[64];
  std::snprintf(name, sizeof name, "/flight-recorder-rank-%05d.txt", rank());
  return dir + name;
}

void CommMonitor::set_channel(std::shared_ptr<HealthChannel> channel) { channel_ = std::move(channel); }

bool CommMonitor::remote_failure_announced() const {
  return channel_ != nullptr && channel_->failure_announced();
}

void CommMonitor::throw_remote_failure(const std::string& during) {
  const std::vector<AnnouncedFailure> f = channel_->announced_failures();
  const AnnouncedFailure& first = f.front();
  const std::string why = "rank " + std::to_string(first.rank) + " failed: " + first.message;
  mark_failed(why);
  dump("stopped during " + during + " because " + why);
  throw RemoteFailure("stopping because " + why, first.rank);
}

void CommMonitor::set_abort_hook(std::function<void()> abort) {
  std::lock_guard<std::mutex> lock(mu_);
  abort_hook_ = std::move(abort);
}

void CommMonitor::mark_failed(const std::string& why) {
  std::function<void()> abort;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.exchange(true)) return;
    failure_ = why;
    abort = std::move(abort_hook_);
  }
  // The transport's pending ops cannot complete any more: the backend stops
  // them (its errors are its own; this path is already failing).
  if (abort) {
    try {
      abort();
    } catch (...) {
    }
  }
}

void CommMonitor::check_usable() {
  if (remote_failure_announced()) throw_remote_failure("issuing a collective");
  if (failed_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    throw Error("this communicator failed earlier and cannot be used any more (" + failure_ +
                "): end the job and restart it from the last checkpoint");
  }
}

std::string CommMonitor::dump(const std::string& reason) {
  const std::string path = dump_path();
  const std::string dir = path.substr(0, path.rfind('/'));
  if (!make_dirs(dir)) {
    return "(not written: cannot create " + dir + ": " + std::strerror(errno) + ")";
  }
  const std::string text = recorder_.format(rank(), world_size(), reason);
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return "(not written: cannot open " + path + ": " + std::strerror(errno) + ")";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return "(not written completely: " + path + ")";
  return path;
}

void CommMonitor::abandon(std::uint64_t, WorkPtr work) {
  if (work) work->abandon();
  // Leaked on purpose, see the header.
  static std::mutex mu;
  static auto* graveyard = new std::vector<WorkPtr>();
  std::lock_guard<std::mutex> lock(mu);
  graveyard->push_back(std::move(work));
}

CommMonitor::PeerReport CommMonitor::ask_peers(std::uint64_t seq, const std::optional<OpRecord>& mine) {
  const int me = rank(), n = world_size();
  PeerReport report;
  std::ostringstream os;
  if (channel_ == nullptr || n <= 1) {
    report.text = "; this backend cannot ask the other ranks what they are doing: see their own errors";
    return report;
  }
  const std::vector<std::optional<FlightRecord>> peers = channel_->query_peers(kQueryRecords, kQueryGrace);
  bool all_answered = true;
  for (int q = 0; q < n; ++q) all_answered = all_answered && (q == me || peers[static_cast<std::size_t>(q)]);
  if (all_answered) {
    std::vector<FlightRecord> all;
    for (int q = 0; q < n; ++q) all.push_back(q == me ? recorder_.tail(kQueryRecords) : *peers[static_cast<std::size_t>(q)]);
    IssuedDivergence d = find_issued_divergence(all);
    report.divergence = std::move(d.text);
    report.divergence_key = std::move(d.key);
  }
  std::vector<int> silent, behind, waiting, done, failed;
  std::vector<std::string> behind_detail, diverged;
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    if (!peers[q]) {
      silent.push_back(q);
      continue;
    }
    const FlightRecord& p = *peers[q];
    if (p.issued <= seq) {
      behind.push_back(q);
      std::ostringstream d;
      d << "rank " << q << " has issued " << p.issued << " ops";
      if (!p.records.empty()) d << ", its last " << describe(p.records.back(), steady_now_ns());
      behind_detail.push_back(d.str());
      continue;
    }
    const OpRecord* r = p.find(seq);
    if (r != nullptr && mine && !(r->sig == mine->sig)) {
      diverged.push_back("rank " + std::to_string(q) + " issued " + describe(r->sig) + " as op #" +
                         std::to_string(seq));
    } else if (r != nullptr && r->state == OpState::kCompleted) {
      done.push_back(q);
    } else if (r != nullptr && r->state == OpState::kFailed) {
      failed.push_back(q);
    } else {
      waiting.push_back(q);
    }
  }
  std::vector<int> missing = silent;
  missing.insert(missing.end(), behind.begin(), behind.end());
  if (!missing.empty()) {
    os << ": " << format_ranks(missing) << (missing.size() == 1 ? " has" : " have")
       << " not joined it";
  }
  if (!silent.empty()) {
    os << "; " << format_ranks(silent) << (silent.size() == 1 ? " does" : " do")
       << " not answer (the process is stopped, killed or unreachable: its watchdog did not reply "
          "within "
       << seconds(kQueryGrace) << ")";
  }
  for (const std::string& d : behind_detail) {
    os << "; " << d << " (it is alive but has not reached this op: busy in computation or I/O, "
          "or stuck)";
  }
  for (const std::string& d : diverged) os << "; " << d << " (the ranks' sequences diverge)";
  if (!waiting.empty()) {
    os << "; " << format_ranks(waiting) << (waiting.size() == 1 ? " waits" : " wait")
       << " in it too";
  }
  if (!failed.empty()) {
    os << "; it failed on " << format_ranks(failed) << " too";
  }
  if (!done.empty()) {
    os << "; " << format_ranks(done) << (done.size() == 1 ? " has" : " have") << " completed it";
  }
  report.text = os.str();
  return report;
}

void CommMonitor::throw_divergence(const std::string& during, const PeerReport& peers) {
  const std::string what = "collective-sequence check failed: " + peers.divergence +
                           " (every rank must issue the same collectives in the same order with "
                           "the same reduce op, dtype, count, root and tag: look for a branch "
                           "that depends on the rank or on its data; at stage 3, units called in "
                           "another order or another number of times)";
  mark_failed(during + ": " + what);
  const std::string path = dump(during + ": " + what);
  throw SequenceMismatch(what + ", found when " + during + ". Flight recorders: " +
                             all_recorders(path),
                         /*key=*/peers.divergence_key);
}

void CommMonitor::throw_timeout(std::uint64_t seq) {
  const int me = rank(), n = world_size();
  const std::optional<OpRecord> mine = recorder_.find(seq);
  std::ostringstream os;
  os << name_op(seq, mine) << " did not complete within comm_timeout = " << seconds(timeout()) << " on rank " << me
     << " of " << n;
  const PeerReport peers = ask_peers(seq, mine);
  if (!peers.divergence.empty()) {
    throw_divergence("collective #" + std::to_string(seq) + " did not complete within comm_timeout on rank " +
                         std::to_string(me),
                     peers);
  }
  const std::string what = os.str() + peers.text;
  mark_failed(what);
  const std::string path = dump(what);
  throw CollectiveTimeout(
      what + ". Flight recorder: " + path +
          ". If a rank is legitimately slower here (a long save or data load), raise "
          "comm_timeout (seconds, config top level); otherwise see what the ranks named above "
          "are doing (their flight-recorder files are beside this one)",
      seq);
}

void CommMonitor::throw_failure(std::uint64_t seq, const std::string& error) {
  const std::optional<OpRecord> mine = recorder_.find(seq);
  std::ostringstream os;
  os << name_op(seq, mine) << " failed on rank " << rank() << " of " << world_size() << " (" << error << ")";
  const PeerReport peers = ask_peers(seq, mine);
  if (!peers.divergence.empty()) {
    throw_divergence("collective #" + std::to_string(seq) + " failed on rank " + std::to_string(rank()) +
                         " (" + error + ")",
                     peers);
  }
  const std::string what = os.str() + peers.text;
  mark_failed(what);
  const std::string path = dump(what);
  throw CollectiveFailed(what + ". Flight recorder: " + path +
                             ". A transport error in a collective that the ranks issued alike is "
                             "the network's or the MPI library's: see their logs",
                         seq);
}

void CommMonitor::check_sequence() {
  if (channel_ == nullptr || world_size() <= 1) return;
  check_usable();
  const FlightRecord head = recorder_.tail(0);  // count and hash only
  std::vector<std::string> heads;
  try {
    heads = channel_->all_gather(serialize(head), timeout());
  } catch (const Error& e) {
    const std::string why = std::string("the collective-sequence check did not complete: ") + e.what();
    mark_failed(why);
    throw Error(why + ". Flight recorder: " + dump(why));
  }
  bool same = true;
  for (const std::string& h : heads) {
    const FlightRecord r = parse_flight_record(h);
    same = same && r.issued == head.issued && r.hash == head.hash;
  }
  if (same) return;
  // They differ: compare the kept records to name where.
  std::vector<std::string> blobs = channel_->all_gather(serialize(recorder_.snapshot()), timeout());
  std::vector<FlightRecord> all;
  all.reserve(blobs.size());
  for (const std::string& b : blobs) all.push_back(parse_flight_record(b));
  const std::string what = "collective-sequence check failed: " + find_divergence(all) +
                           " (every rank must issue the same collectives in the same order with "
                           "the same reduce op, dtype, count, root and tag)";
  mark_failed(what);
  const std::string path = dump(what);
  throw SequenceMismatch(what + ". Flight recorders: " + all_recorders(path));
}

}  // namespace zero::comm::detail
