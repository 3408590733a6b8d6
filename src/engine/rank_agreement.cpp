#include "rank_agreement.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

namespace zero::detail {

std::vector<std::string> all_gather_text(comm::Communicator& comm, const c10::Device& device, const std::string& mine) {
  const int world = comm.world_size();
  if (world == 1) return {mine};
  const auto gather_words = [&](const std::vector<std::int32_t>& words) {
    const auto n = static_cast<std::int64_t>(words.size());
    at::Tensor in = at::from_blob(const_cast<std::int32_t*>(words.data()), {n}, at::kInt).to(device, false, true);
    at::Tensor out = at::empty({n * world}, at::TensorOptions().dtype(at::kInt).device(device));
    comm.all_gather(in.data_ptr(), out.data_ptr(), static_cast<std::size_t>(n), DType::kFloat32)->wait();
    out = out.to(at::kCPU);
    return std::vector<std::int32_t>(out.data_ptr<std::int32_t>(), out.data_ptr<std::int32_t>() + n * world);
  };
  const std::vector<std::int32_t> lengths = gather_words({static_cast<std::int32_t>(mine.size())});
  const std::size_t longest = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::vector<std::int32_t> words((longest + 3) / 4 + 1, 0);
  std::memcpy(words.data(), mine.data(), mine.size());
  const std::vector<std::int32_t> all = gather_words(words);
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    const char* p = reinterpret_cast<const char*>(all.data() + static_cast<std::size_t>(r) * words.size());
    out.emplace_back(p, static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]));
  }
  return out;
}

}  // namespace zero::detail
