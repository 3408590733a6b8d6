// A value per parameter (the class of its optimizer settings: its weight
// decay and lr scale) as one rank's partition sees it: the runs of
// partition elements that share one value, in partition order
// (zero/zero/flat_layout.h says which flat elements the partition holds).
// The optimizer steps a piece of the partition run by run.
//
// Padding (the zeros after a bucket's parameters) has no value of its own:
// it joins the run before it (the first run where nothing comes before), so
// a padded bucket does not split a run. Its elements stay zero whatever the
// value: their gradients are zero.
#pragma once

#include <cstddef>
#include <vector>

#include "zero/zero/flat_layout.h"

namespace zero {

struct PartitionRun {
  std::size_t begin = 0;  // in the partition
  std::size_t end = 0;    // one past the last element
  int value = 0;
};

class PartitionRuns {
 public:
  PartitionRuns() = default;  // no values: every element takes the caller's default
  // per_param: a value for each of the layout's parameters, in its order.
  PartitionRuns(const FlatLayout& layout, int shard_rank, const std::vector<int>& per_param);

  bool empty() const { return runs_.empty(); }
  const std::vector<PartitionRun>& runs() const { return runs_; }
  // The runs that cover partition elements [begin, begin + n), clipped to
  // it, in order (none when there are no values).
  std::vector<PartitionRun> within(std::size_t begin, std::size_t n) const;

 private:
  std::vector<PartitionRun> runs_;  // cover [0, partition_numel) without gaps
};

}  // namespace zero
