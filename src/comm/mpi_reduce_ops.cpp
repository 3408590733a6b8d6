#include "mpi_reduce_ops.h"

#include "mpi_runtime.h"
#include "zero/comm/mpi_check.h"
#include "zero/core/error.h"

namespace zero::comm::detail {
namespace {

// MPI_User_function takes no user data, so each (op, dtype) is its own
// function; the datatype argument is always the one mpi_datatype() gave.
template <ReduceOp kOp, DType kDType>
void user_op(void* in, void* inout, int* len, MPI_Datatype* /*datatype*/) {
  reduce_into(kOp, kDType, in, inout, static_cast<std::size_t>(*len));
}

template <ReduceOp kOp, DType kDType>
MPI_Op create_op() {
  MPI_Op op = MPI_OP_NULL;
  // commute = 1: both ops are commutative (and symmetric bit for bit), which
  // lets MPI pick its faster algorithms.
  ZERO_MPI_CHECK(MPI_Op_create(&user_op<kOp, kDType>, /*commute=*/1, &op));
  return op;
}

int index_of(DType dtype) { return static_cast<int>(dtype); }

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kBFloat16:
    case DType::kFloat16:
      return MPI_UINT16_T;
  }
  ZERO_INTERNAL_ASSERT(false, "unknown dtype ", static_cast<int>(dtype));
}

MpiReduceOps::MpiReduceOps() {
  max_[index_of(DType::kFloat32)] = create_op<ReduceOp::kMax, DType::kFloat32>();
  max_[index_of(DType::kBFloat16)] = create_op<ReduceOp::kMax, DType::kBFloat16>();
  max_[index_of(DType::kFloat16)] = create_op<ReduceOp::kMax, DType::kFloat16>();
  sum_[index_of(DType::kBFloat16)] = create_op<ReduceOp::kSum, DType::kBFloat16>();
  sum_[index_of(DType::kFloat16)] = create_op<ReduceOp::kSum, DType::kFloat16>();
}

MpiReduceOps::~MpiReduceOps() {
  if (mpi_finalized()) return;
  for (MPI_Op* ops : {max_, sum_}) {
    for (int i = 0; i < kNumDTypes; ++i) {
      if (ops[i] != MPI_OP_NULL) MPI_Op_free(&ops[i]);
    }
  }
}

MPI_Op MpiReduceOps::get(ReduceOp op, DType dtype) const {
  switch (op) {
    case ReduceOp::kSum:
      return dtype == DType::kFloat32 ? MPI_SUM : sum_[index_of(dtype)];
    case ReduceOp::kMax:
      return max_[index_of(dtype)];
  }
  ZERO_INTERNAL_ASSERT(false, "unknown reduce op ", static_cast<int>(op));
}

}  // namespace zero::comm::detail
