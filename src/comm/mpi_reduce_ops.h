// The MPI datatypes and reduction ops the MPI backend uses for each DType.
//
// fp32 sums use MPI's own MPI_SUM on MPI_FLOAT. MPI has no 16-bit float
// types, so bf16 and fp16 travel as MPI_UINT16_T and are reduced by user ops
// (MPI_Op_create) that run reduce_into (reduce_op.h): widen to fp32, combine,
// round back to nearest even. kMax is a user op for every dtype, for the NaN
// and +-0 guarantees reduce_op.h gives.
#pragma once

#include <mpi.h>

#include "zero/comm/reduce_op.h"
#include "zero/core/dtype.h"

namespace zero::comm::detail {

MPI_Datatype mpi_datatype(DType dtype);

// Owns the user ops; create it after MPI_Init. The ops are freed with it
// (unless MPI is already finalised, which freed them).
class MpiReduceOps {
 public:
  MpiReduceOps();
  ~MpiReduceOps();
  MpiReduceOps(const MpiReduceOps&) = delete;
  MpiReduceOps& operator=(const MpiReduceOps&) = delete;

  MPI_Op get(ReduceOp op, DType dtype) const;

 private:
  static constexpr int kNumDTypes = 3;
  MPI_Op max_[kNumDTypes] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op sum_[kNumDTypes] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // 16-bit only
};

}  // namespace zero::comm::detail
