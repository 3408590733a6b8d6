#include "mpi_health_channel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "mpi_runtime.h"
#include "zero/comm/mpi_check.h"
#include "zero/core/error.h"

namespace zero::comm::detail {
namespace {

constexpr int kTagQuery = 1;    // payload: std::uint64_t query id
constexpr int kTagStatus = 2;   // payload: query id + serialized FlightRecord
constexpr int kTagFailure = 3;  // payload: key length (u64), key, message
constexpr std::chrono::milliseconds kWatchdogPeriod{10};

using Clock = std::chrono::steady_clock;

// A send and the bytes it reads, kept until MPI is done with them.
struct PendingSend {
  std::string bytes;
  MPI_Request request = MPI_REQUEST_NULL;
  std::uint64_t id = 0;
};

class MpiHealthChannel final : public HealthChannel {
 public:
  MpiHealthChannel(MPI_Comm parent, const FlightRecorder& recorder) : recorder_(recorder) {
    ZERO_MPI_CHECK(MPI_Comm_dup(parent, &control_));
    ZERO_MPI_CHECK(MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN));
    ZERO_MPI_CHECK(MPI_Comm_dup(parent, &exchange_));
    ZERO_MPI_CHECK(MPI_Comm_set_errhandler(exchange_, MPI_ERRORS_RETURN));
    ZERO_MPI_CHECK(MPI_Comm_rank(control_, &rank_));
    ZERO_MPI_CHECK(MPI_Comm_size(control_, &world_));
    stopper_ = add_finalize_stopper([](void* self) { static_cast<MpiHealthChannel*>(self)->stop(); }, this);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~MpiHealthChannel() override {
    stop();
    remove_finalize_stopper(stopper_);
    if (mpi_finalized()) return;
    // Sends still in flight go to ranks that never received them (failed
    // jobs): leave them to MPI rather than wait.
    for (PendingSend& p : sends_) {
      if (p.request != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Test(&p.request, &done, MPI_STATUS_IGNORE);
        if (!done) {
          MPI_Request_free(&p.request);
          new std::string(std::move(p.bytes));  // leaked: MPI may still read it
        }
      }
    }
    MPI_Comm_free(&control_);
    MPI_Comm_free(&exchange_);
  }

  std::vector<std::optional<FlightRecord>> query_peers(std::size_t records,
                                                       std::chrono::milliseconds grace) override {
    std::vector<std::optional<FlightRecord>> out(static_cast<std::size_t>(world_));
    out[static_cast<std::size_t>(rank_)] = recorder_.tail(records);
    const std::uint64_t id = next_query_.fetch_add(1) + 1;
    std::string payload(sizeof id + sizeof(std::uint64_t), '\0');
    const std::uint64_t n = records;
    std::memcpy(payload.data(), &id, sizeof id);
    std::memcpy(payload.data() + sizeof id, &n, sizeof n);
    for (int q = 0; q < world_; ++q) {
      if (q != rank_) send(q, kTagQuery, payload);
    }
    int missing = world_ - 1;
    const Clock::time_point deadline = Clock::now() + grace;
    std::string buf;
    while (missing > 0 && Clock::now() < deadline) {
      MPI_Status st;
      if (!probe(MPI_ANY_SOURCE, kTagStatus, &st)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      receive(st, &buf);
      std::uint64_t got = 0;
      if (buf.size() < sizeof got) continue;
      std::memcpy(&got, buf.data(), sizeof got);
      if (got != id || out[static_cast<std::size_t>(st.MPI_SOURCE)]) continue;  // an old answer
      try {
        out[static_cast<std::size_t>(st.MPI_SOURCE)] = parse_flight_record(buf.substr(sizeof got));
        --missing;
      } catch (const Error&) {
        // A garbled answer counts as none.
      }
    }
    return out;
  }

  std::vector<std::string> all_gather(const std::string& blob,
                                      std::chrono::milliseconds timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(world_));
    std::uint64_t mine = blob.size();
    MPI_Request r = MPI_REQUEST_NULL;
    ZERO_MPI_CHECK(MPI_Iallgather(&mine, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, exchange_, &r));
    wait_until(r, deadline, "the ranks' sizes");
    std::vector<int> counts(sizes.size()), displs(sizes.size());
    std::size_t total = 0;
    for (std::size_t q = 0; q < sizes.size(); ++q) {
      ZERO_CHECK(sizes[q] <= (1u << 30), "rank ", q, " sent a health-channel blob of ", sizes[q],
                 " bytes");
      counts[q] = static_cast<int>(sizes[q]);
      displs[q] = static_cast<int>(total);
      total += sizes[q];
      ZERO_CHECK(total <= static_cast<std::size_t>(INT32_MAX), "health-channel exchange too large");
    }
    std::string all(total, '\0');
    ZERO_MPI_CHECK(MPI_Iallgatherv(blob.data(), static_cast<int>(blob.size()), MPI_BYTE, all.data(),
                              counts.data(), displs.data(), MPI_BYTE, exchange_, &r));
    wait_until(r, deadline, "the ranks' records");
    std::vector<std::string> out;
    for (std::size_t q = 0; q < sizes.size(); ++q) out.push_back(all.substr(displs[q], counts[q]));
    return out;
  }

  void announce_failure(const std::string& key, const std::string& message,
                        std::chrono::milliseconds grace) override {
    std::string payload(sizeof(std::uint64_t), '\0');
    const std::uint64_t k = key.size();
    std::memcpy(payload.data(), &k, sizeof k);
    payload += key;
    payload += message;
    std::vector<std::uint64_t> mine;
    for (int q = 0; q < world_; ++q) {
      if (q != rank_) mine.push_back(send(q, kTagFailure, payload));
    }
    const Clock::time_point deadline = Clock::now() + grace;
    for (;;) {
      bool all = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        reap_locked();
        for (const PendingSend& p : sends_) {
          all = all && std::find(mine.begin(), mine.end(), p.id) == mine.end();
        }
      }
      if (all || Clock::now() >= deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::vector<AnnouncedFailure> announced_failures() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }

  bool failure_announced() const override { return any_failure_.load(std::memory_order_acquire); }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    std::lock_guard<std::mutex> lock(join_mu_);
    if (watchdog_.joinable()) watchdog_.join();
  }

  // Sends `bytes` to `to` without blocking; the send is completed later
  // (reap_locked). Returns the send's id.
  std::uint64_t send(int to, int tag, const std::string& bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    sends_.push_back({bytes, MPI_REQUEST_NULL, ++next_send_});
    PendingSend& p = sends_.back();
    if (MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, to, tag, control_,
                  &p.request) != MPI_SUCCESS) {
      p.request = MPI_REQUEST_NULL;
    }
    return p.id;
  }

  // Drops completed sends. mu_ held.
  void reap_locked() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 1;
      if (it->request != MPI_REQUEST_NULL) MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? sends_.erase(it) : std::next(it);
    }
  }

  bool probe(int source, int tag, MPI_Status* st) {
    int flag = 0;
    if (MPI_Iprobe(source, tag, control_, &flag, st) != MPI_SUCCESS) return false;
    return flag != 0;
  }

  void receive(const MPI_Status& st, std::string* buf) {
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    buf->assign(static_cast<std::size_t>(std::max(n, 0)), '\0');
    MPI_Recv(buf->data(), n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, control_, MPI_STATUS_IGNORE);
  }

  void wait_until(MPI_Request& r, Clock::time_point deadline, const char* what) {
    for (;;) {
      int done = 0;
      ZERO_MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
      if (done) return;
      if (Clock::now() >= deadline) {
        // Left to MPI: the job is failing.
        throw Error(std::string("not every rank joined the exchange of ") + what +
                    " within comm_timeout");
      }
      std::this_thread::yield();
    }
  }

  void watch() {
    std::string buf;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, kWatchdogPeriod, [this] { return stopping_; })) return;
        reap_locked();
      }
      MPI_Status st;
      while (probe(MPI_ANY_SOURCE, kTagQuery, &st)) {
        receive(st, &buf);
        std::uint64_t id = 0, n = 0;
        if (buf.size() < sizeof id + sizeof n) continue;
        std::memcpy(&id, buf.data(), sizeof id);
        std::memcpy(&n, buf.data() + sizeof id, sizeof n);
        std::string reply(sizeof id, '\0');
        std::memcpy(reply.data(), &id, sizeof id);
        reply += serialize(recorder_.tail(static_cast<std::size_t>(n)));
        send(st.MPI_SOURCE, kTagStatus, reply);
      }
      while (probe(MPI_ANY_SOURCE, kTagFailure, &st)) {
        receive(st, &buf);
        std::uint64_t k = 0;
        if (buf.size() < sizeof k) continue;
        std::memcpy(&k, buf.data(), sizeof k);
        if (k > buf.size() - sizeof k) continue;
        AnnouncedFailure f;
        f.rank = st.MPI_SOURCE;
        f.key = buf.substr(sizeof k, k);
        f.message = buf.substr(sizeof k + k);
        std::lock_guard<std::mutex> lock(mu_);
        failures_.push_back(std::move(f));
        any_failure_.store(true, std::memory_order_release);
      }
    }
  }

  const FlightRecorder& recorder_;
  MPI_Comm control_ = MPI_COMM_NULL, exchange_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1;
  int stopper_ = 0;
  std::atomic<std::uint64_t> next_query_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::mutex join_mu_;
  std::uint64_t next_send_ = 0;
  bool stopping_ = false;
  std::list<PendingSend> sends_;  // a list: requests and bytes must not move
  std::vector<AnnouncedFailure> failures_;
  std::atomic<bool> any_failure_{false};
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<HealthChannel> make_mpi_health_channel(MPI_Comm parent, const FlightRecorder& recorder) {
  return std::make_shared<MpiHealthChannel>(parent, recorder);
}

}  // namespace zero::comm::detail
