// A host copy of a tensor for an asynchronous checkpoint save: training
// goes on once it is taken, and the save writes from it. Backed by an
// anonymous mapping populated by the kernel in one go, so that taking it
// costs less than first-touch page faults one by one (on the development
// VM, 800 MB: 0.27 s against 0.46–0.50 s; advising transparent huge pages
// was faster once, 0.22 s, and 1.9 s another time: compaction).
#pragma once

#include <ATen/core/Tensor.h>

namespace zero::detail {

at::Tensor host_snapshot(const at::Tensor& t);

}  // namespace zero::detail
