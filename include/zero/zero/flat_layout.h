// Where every parameter lives in the flat buffers, and which part of them each
// rank owns.
//
// Layout contract (params, grads and their partitions all follow it):
//  - Parameters are packed back to front: the flat buffer starts with the
//    model's LAST parameter, because backward produces gradients roughly in
//    reverse order, so buckets fill one after another.
//  - The flat buffer is a sequence of buckets. A bucket holds whole
//    parameters, at most `bucket_numel` elements of them (a larger parameter
//    gets a bucket of its own), and is padded with zeros to a multiple of
//    `pad_world * align` elements (`padded`).
//  - Each bucket is split into `shard_world` equal chunks of `chunk =
//    padded / shard_world` elements; rank r owns chunk r of EVERY bucket, at
//    flat offset `bucket.offset + r * chunk`. So a reduce-scatter or an
//    all-gather of one bucket is in place in the sense NCCL documents
//    (recvbuff == sendbuff + rank * chunk).
//  - A rank's partition (fp32 master, moments, gradient partition) is its
//    chunks of all buckets, concatenated in bucket order: bucket k's chunk
//    sits at `bucket.partition_offset` in every rank's partition.
//  - Stage 3: each parameter may belong to a group (a unit, gathered and
//    released together; -1: none); a bucket holds parameters of one group
//    only, so a unit's parameters are whole buckets. A parameter of no group
//    that lies among a group's (a block's bias or norm gain between its
//    matrices) is packed right after the group's last one instead, so that
//    it cuts neither the unit's buckets nor its own kept ones into pieces.
// Stage 0 uses shard_world = 1 (every rank owns everything).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zero {

struct ParamSlot {
  std::size_t offset = 0;  // first element in the flat buffer
  std::size_t numel = 0;
  int bucket = 0;
};

struct Bucket {
  std::size_t offset = 0;            // first element in the flat buffer
  std::size_t numel = 0;             // elements of parameters (the rest is padding)
  std::size_t padded = 0;            // numel rounded up to pad_world * align
  std::size_t chunk = 0;             // padded / shard_world: what one rank owns
  std::size_t partition_offset = 0;  // where that chunk sits in every rank's partition
  std::vector<int> params;           // indices of the parameters it holds
  int group = -1;                    // the group all of them belong to (-1: none)
};

// The tag of bucket b's collectives (comm::AllGatherOptions::tag and the
// like): b + 1, so that the collective-sequence check tells apart buckets
// of the same size issued in another order on one rank.
inline std::uint32_t bucket_tag(std::size_t b) { return static_cast<std::uint32_t>(b + 1); }
inline std::uint32_t bucket_tag(int b) { return bucket_tag(static_cast<std::size_t>(b)); }

// zero_optimization.reduce_bucket_size (elements, 0 or more) as a bucket's
// bound: 0 is DeepSpeed's "a bucket per parameter", which a bound of 1
// gives (a larger parameter gets a bucket of its own). The engine, zero-train
// and zero-estimate all map it here, so their layouts agree.
inline std::size_t bucket_numel_from_config(std::int64_t reduce_bucket_size) {
  return reduce_bucket_size < 1 ? 1 : static_cast<std::size_t>(reduce_bucket_size);
}

class FlatLayout {
 public:
  FlatLayout() = default;
  // numels: parameter sizes in the model's order; groups: empty, or each
  // parameter's group (-1: none), the same length.
  FlatLayout(const std::vector<std::size_t>& numels, std::size_t bucket_numel, int pad_world,
             int shard_world, std::size_t align, const std::vector<int>& groups = {});

  const std::vector<ParamSlot>& params() const { return params_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  std::size_t numel() const { return numel_; }                  // parameters only (Psi)
  std::size_t padded_numel() const { return padded_numel_; }    // the flat buffer
  std::size_t partition_numel() const { return partition_numel_; }
  int shard_world() const { return shard_world_; }
  // Elements of rank r's partition that are parameters (not padding).
  std::size_t partition_valid(int rank) const;
  // The buckets of group g, in bucket order.
  std::vector<int> group_buckets(int g) const;

 private:
  std::vector<ParamSlot> params_;
  std::vector<Bucket> buckets_;
  std::size_t numel_ = 0, padded_numel_ = 0, partition_numel_ = 0;
  int shard_world_ = 1;
};

}  // namespace zero
