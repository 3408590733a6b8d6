// The MPI backend: host buffers, MPI's non-blocking collectives on
// duplicates of MPI_COMM_WORLD (one per kind of collective).
#include "zero/comm/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "zero/comm/detail/collective_args.h"
#include "mpi_health_channel.h"
#include "mpi_piece_queue.h"
#include "mpi_reduce_ops.h"
#include "mpi_runtime.h"
#include "mpi_work.h"
#include "zero/comm/mpi_check.h"
#include "zero/core/error.h"

namespace zero::comm {
namespace {

using detail::MpiOpInfo;
using detail::MpiWork;

#if defined(OPEN_MPI)
constexpr bool kOpenMpi = true;
#else
constexpr bool kOpenMpi = false;
#endif
// Below this, libnbc's all-reduce is binomial even out of place.
constexpr std::size_t kLibnbcRingMinBytes = 64 * 1024;

// What in-flight Works need after the communicator is gone: the MPI
// communicator and the user ops. Shared by the communicator and its Works.
struct MpiResources {
  MPI_Comm comm = MPI_COMM_NULL;
  // One communicator per kind of collective (CollectiveKind's order). MPI
  // matches collectives by their order on a communicator, not by kind: a
  // rank in an all-gather where the others are in an all-reduce would be
  // matched with them, and the one with the smaller buffer written past
  // (memory corrupted before any error is raised). Apart, the mismatched
  // ops wait for each other until comm_timeout, whose error names the
  // divergence. Ops of one kind keep their order among themselves.
  std::array<MPI_Comm, kNumCollectiveKinds> by_kind;
  detail::MpiReduceOps ops;
  // The reduce-scatters and the all-reduces, each kind a piece at a time
  // (mpi_piece_queue.h: what MPI holds for them stays bounded).
  std::shared_ptr<detail::MpiPieceQueue> pieces = std::make_shared<detail::MpiPieceQueue>();

  MpiResources() { by_kind.fill(MPI_COMM_NULL); }
  MpiResources(const MpiResources&) = delete;
  MpiResources& operator=(const MpiResources&) = delete;
  ~MpiResources() {
    if (detail::mpi_finalized()) return;
    for (MPI_Comm& c : by_kind) {
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    }
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  MPI_Comm of(CollectiveKind kind) const { return by_kind[static_cast<std::size_t>(kind)]; }
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const MpiCommunicatorOptions& options) : options_(options) {
    ZERO_CHECK(options_.max_elements_per_call > 0 &&
                   options_.max_elements_per_call <= static_cast<std::size_t>(INT_MAX),
               "MpiCommunicatorOptions::max_elements_per_call must be in [1, INT_MAX], got ",
               options_.max_elements_per_call);
    ZERO_CHECK(options_.piece_bytes > 0, "MpiCommunicatorOptions::piece_bytes must be at least 1");
    detail::ensure_mpi_initialized();
    resources_ = std::make_shared<MpiResources>();
    // Our own communicator, so that our collectives never match a caller's
    // on MPI_COMM_WORLD, and so that errors come back as codes
    // (MPI_ERRORS_RETURN) instead of aborting: ZERO_MPI_CHECK turns them into
    // zero::Error.
    ZERO_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &resources_->comm));
    ZERO_MPI_CHECK(MPI_Comm_set_errhandler(resources_->comm, MPI_ERRORS_RETURN));
    ZERO_MPI_CHECK(MPI_Comm_rank(resources_->comm, &rank_));
    ZERO_MPI_CHECK(MPI_Comm_size(resources_->comm, &world_size_));
    for (MPI_Comm& c : resources_->by_kind) {
      ZERO_MPI_CHECK(MPI_Comm_dup(resources_->comm, &c));
      ZERO_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    }
    MPI_Comm node = MPI_COMM_NULL;
    ZERO_MPI_CHECK(
        MPI_Comm_split_type(resources_->comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    ZERO_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    ZERO_MPI_CHECK(MPI_Comm_free(&node));
    if (options_.health_channel && world_size_ > 1) {
      set_health_channel(detail::make_mpi_health_channel(resources_->comm, mutable_flight_recorder()));
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return local_rank_; }
  std::string backend_name() const override { return "mpi"; }

  WorkPtr do_all_reduce(void* data, std::size_t count, DType dtype,
                     const AllReduceOptions& options) override {
    detail::check_buffer(data, count, "all_reduce", "data");
    const MPI_Op op = resources_->ops.get(options.op, dtype);
    const std::size_t es = element_size(dtype);
    detail::checked_mul(count, es, "all_reduce");
    const std::size_t per_piece = elements_per_piece(es);
    const std::size_t pieces = (count + per_piece - 1) / per_piece;
    // Open MPI's non-blocking all-reduce (libnbc) runs the in-place form as a
    // binomial reduce + broadcast whatever the size: the root then sends and
    // receives the whole piece log2(N) times. Only the out-of-place form may
    // use its ring (N >= 4, >= 64 KiB, commutative op), which sends
    // 2 (N-1)/N of it. A scratch copy of each piece buys the ring for one
    // memcpy (one piece at a time: the scratch is a piece).
    const std::size_t piece_bytes = std::min(count, per_piece) * es;
    const bool stage = kOpenMpi && world_size_ >= 4 && piece_bytes >= kLibnbcRingMinBytes &&
                       piece_bytes <= options_.all_reduce_staging_max_bytes;
    auto piece = std::make_shared<detail::MpiPieceQueue::Op>();
    std::shared_ptr<detail::PieceBuffer> scratch;
    if (stage) {
      scratch = std::make_shared<detail::PieceBuffer>(piece_bytes);
      piece->on_complete = [scratch] { scratch->release(); };
    }
    auto* base = static_cast<unsigned char*>(data);
    const MPI_Datatype type = detail::mpi_datatype(dtype);
    const MPI_Comm comm = resources_->of(CollectiveKind::kAllReduce);
    piece->pieces = pieces;
    piece->issue = [=, buffer = scratch.get()](std::size_t i, MPI_Request* request) {
      const std::size_t first = i * per_piece, n = std::min(per_piece, count - first);
      unsigned char* at = base + first * es;
      const void* send = MPI_IN_PLACE;
      if (buffer != nullptr) {
        unsigned char* raw = buffer->get();
        std::memcpy(raw, at, n * es);
        send = raw;
      }
      ZERO_MPI_CHECK(MPI_Iallreduce(send, at, static_cast<int>(n), type, op, comm, request));
    };
    return queued(detail::MpiPieceQueue::kAllReduce, std::move(piece), CollectiveKind::kAllReduce, count, dtype,
                  std::move(scratch));
  }

  WorkPtr do_reduce_scatter(const void* input, void* output, std::size_t count_per_rank, DType dtype,
                         const ReduceScatterOptions& options) override {
    const char* name = "reduce_scatter";
    detail::check_buffer(input, count_per_rank, name, "input");
    detail::check_buffer(output, count_per_rank, name, "output");
    const bool in_place =
        detail::is_in_place(input, output, count_per_rank, dtype, world_size_, rank_, name);
    const std::size_t es = element_size(dtype);
    detail::checked_mul(detail::checked_mul(count_per_rank, static_cast<std::size_t>(world_size_), name), es, name);
    const MPI_Op op = resources_->ops.get(options.op, dtype);
    const MPI_Datatype type = detail::mpi_datatype(dtype);
    const MPI_Comm comm = resources_->of(CollectiveKind::kReduceScatter);
    const int world = world_size_, rank = rank_;
    // Each piece: elements [first, first + n) of every rank's slot.
    const std::size_t per_piece =
        std::max<std::size_t>(1, elements_per_piece(es * static_cast<std::size_t>(world_size_)));
    const std::size_t pieces = (count_per_rank + per_piece - 1) / per_piece;
    if (pieces == 0) return make_completed_work();  // (nothing to send: complete on every rank at once)
    auto piece = std::make_shared<detail::MpiPieceQueue::Op>();
    piece->pieces = pieces;
    const auto* in = static_cast<const unsigned char*>(input);
    auto* out = static_cast<unsigned char*>(output);
    std::shared_ptr<detail::PieceBuffer> pack;
    if (pieces <= 1) {
      if (in_place) {
        // MPI's in-place form reads the whole buffer and leaves this rank's
        // result at its start; our contract (NCCL's) wants it at the rank's
        // slot, so move it there once MPI is done.
        void* whole = const_cast<void*>(input);
        piece->issue = [=](std::size_t, MPI_Request* request) {
          ZERO_MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, whole, static_cast<int>(count_per_rank), type, op, comm,
                                              request));
        };
        if (rank != 0) {
          const std::size_t bytes = count_per_rank * es;
          piece->on_complete = [whole, output, bytes] { std::memmove(output, whole, bytes); };
        }
      } else {
        piece->issue = [=](std::size_t, MPI_Request* request) {
          ZERO_MPI_CHECK(MPI_Ireduce_scatter_block(input, output, static_cast<int>(count_per_rank), type, op, comm,
                                              request));
        };
      }
    } else {
      // Piece i packs elements [first, first + n) of every rank's slot into
      // one buffer and reduces it into the rank's result there. In place,
      // the result of piece i overwrites only input the pack of piece i has
      // read (this rank's slot, the same elements).
      pack = std::make_shared<detail::PieceBuffer>(per_piece * static_cast<std::size_t>(world) * es);
      piece->on_complete = [pack] { pack->release(); };
      piece->issue = [=, buffer = pack.get()](std::size_t i, MPI_Request* request) {
        const std::size_t first = i * per_piece, n = std::min(per_piece, count_per_rank - first);
        unsigned char* raw = buffer->get();
        for (int r = 0; r < world; ++r) {
          std::memcpy(raw + static_cast<std::size_t>(r) * n * es,
                      in + (static_cast<std::size_t>(r) * count_per_rank + first) * es, n * es);
        }
        ZERO_MPI_CHECK(MPI_Ireduce_scatter_block(raw, out + first * es, static_cast<int>(n), type, op, comm, request));
      };
    }
    return queued(detail::MpiPieceQueue::kReduceScatter, std::move(piece), CollectiveKind::kReduceScatter,
                  count_per_rank, dtype, std::move(pack));
  }

  WorkPtr do_all_gather(const void* input, void* output, std::size_t count_per_rank,
                     DType dtype) override {
    const char* name = "all_gather";
    detail::check_buffer(input, count_per_rank, name, "input");
    detail::check_buffer(output, count_per_rank, name, "output");
    const bool in_place =
        detail::is_in_place(output, input, count_per_rank, dtype, world_size_, rank_, name);
    const int n = checked_int_count(count_per_rank, name);
    std::vector<MPI_Request> requests;
    if (count_per_rank > 0) {
      requests.emplace_back(MPI_REQUEST_NULL);
      const MPI_Datatype type = detail::mpi_datatype(dtype);
      // In place, MPI takes this rank's contribution from its slot of output,
      // exactly where our contract has it.
      ZERO_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : input, in_place ? 0 : n,
                               in_place ? MPI_DATATYPE_NULL : type, output, n, type,
                               resources_->of(CollectiveKind::kAllGather), &requests.back()));
    }
    return issued(CollectiveKind::kAllGather, count_per_rank, dtype, std::move(requests));
  }

  WorkPtr do_broadcast(void* data, std::size_t count, DType dtype,
                    const BroadcastOptions& options) override {
    detail::check_buffer(data, count, "broadcast", "data");
    ZERO_CHECK(options.root >= 0 && options.root < world_size_, "broadcast: root ", options.root,
               " is not a rank of this communicator (world size ", world_size_, ")");
    std::vector<MPI_Request> requests;
    for_each_chunk(data, count, dtype, [&](void* chunk, int n) {
      requests.emplace_back(MPI_REQUEST_NULL);
      ZERO_MPI_CHECK(MPI_Ibcast(chunk, n, detail::mpi_datatype(dtype), options.root,
                           resources_->of(CollectiveKind::kBroadcast),
                           &requests.back()));
    });
    return issued(CollectiveKind::kBroadcast, count, dtype, std::move(requests));
  }

  WorkPtr do_barrier() override {
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    ZERO_MPI_CHECK(MPI_Ibarrier(resources_->of(CollectiveKind::kBarrier), &requests.back()));
    return issued(CollectiveKind::kBarrier, 0, DType::kFloat32, std::move(requests));
  }

 private:
  // Splits [data, data + count) into MPI calls of at most
  // max_elements_per_call elements (MPI counts are ints).
  template <typename Issue>
  void for_each_chunk(void* data, std::size_t count, DType dtype, Issue issue) {
    const std::size_t step = options_.max_elements_per_call;
    auto* bytes = static_cast<unsigned char*>(data);
    for (std::size_t offset = 0; offset < count; offset += step) {
      const std::size_t n = std::min(step, count - offset);
      issue(bytes + offset * element_size(dtype), static_cast<int>(n));
    }
  }

  int checked_int_count(std::size_t count_per_rank, const char* op) const {
    detail::checked_mul(count_per_rank, static_cast<std::size_t>(world_size_), op);
    ZERO_CHECK(count_per_rank <= options_.max_elements_per_call, op, " of ", count_per_rank,
               " elements per rank is more than one MPI call can carry (",
               options_.max_elements_per_call,
               "; MPI counts are ints): split the buffer into smaller buckets "
               "(e.g. lower reduce_bucket_size / allgather_bucket_size)");
    return static_cast<int>(count_per_rank);
  }

  // Wraps the op's requests in a Work (the base class counts and records it).
  WorkPtr issued(CollectiveKind kind, std::size_t count, DType dtype,
                 std::vector<MPI_Request> requests, std::function<void()> on_complete = {},
                 std::shared_ptr<const void> scratch = {}) {
    if (requests.empty() && !on_complete) return make_completed_work();
    std::vector<std::shared_ptr<const void>> keepalive{resources_};
    if (scratch) keepalive.push_back(std::move(scratch));
    return std::make_shared<MpiWork>(MpiOpInfo{kind, count, dtype, rank_, world_size_},
                                     std::move(requests), std::move(keepalive),
                                     std::move(on_complete));
  }

  // Elements of `element_bytes` each in one piece of a queued op: at most
  // options_.piece_bytes, and what one MPI call can carry (MPI counts are ints).
  std::size_t elements_per_piece(std::size_t element_bytes) const {
    return std::max<std::size_t>(1, std::min(options_.max_elements_per_call, options_.piece_bytes / element_bytes));
  }

  // Queues the op's pieces and wraps it in a Work (the base class counts and records it).
  WorkPtr queued(detail::MpiPieceQueue::Lane lane, std::shared_ptr<detail::MpiPieceQueue::Op> op,
                 CollectiveKind kind, std::size_t count, DType dtype, std::shared_ptr<const void> scratch) {
    if (op->pieces == 0 && !op->on_complete) return make_completed_work();
    std::vector<std::shared_ptr<const void>> keepalive{resources_};
    if (scratch) keepalive.push_back(std::move(scratch));
    std::string what = "MPI " + std::string(collective_name(kind)) + " of " + std::to_string(count) + " " +
                       std::string(dtype_name(dtype)) + " elements on rank " + std::to_string(rank_) + " of " +
                       std::to_string(world_size_);
    resources_->pieces->submit(lane, op);
    return std::make_shared<detail::MpiPieceWork>(resources_->pieces, std::move(op), std::move(what),
                                                  std::move(keepalive));
  }

  friend void comm::attach_mpi_health_channel(Communicator& transport, Communicator& owner);

  MpiCommunicatorOptions options_;
  std::shared_ptr<MpiResources> resources_;
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const MpiCommunicatorOptions& options) {
  return std::make_unique<MpiCommunicator>(options);
}

std::unique_ptr<Communicator> make_mpi_communicator() {
  return make_mpi_communicator(MpiCommunicatorOptions{});
}

void attach_mpi_health_channel(Communicator& transport, Communicator& owner) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&transport);
  ZERO_CHECK(mpi != nullptr, "attach_mpi_health_channel: the transport is a ", transport.backend_name(),
             " communicator, not an MPI one");
  ZERO_CHECK(owner.rank() == transport.rank() && owner.world_size() == transport.world_size(),
             "attach_mpi_health_channel: the ", owner.backend_name(), " communicator is rank ", owner.rank(), " of ",
             owner.world_size(), " but its transport rank ", transport.rank(), " of ", transport.world_size(),
             ": they must be the same ranks");
  if (owner.world_size() == 1) return;
  ZERO_CHECK(owner.health_channel() == nullptr, "attach_mpi_health_channel: this ", owner.backend_name(),
             " communicator has a health channel already");
  owner.adopt_health_channel(detail::make_mpi_health_channel(mpi->resources_->comm, owner.flight_recorder()));
}

}  // namespace zero::comm
