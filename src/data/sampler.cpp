#include "data/sampler.hpp"

#include "util/hash.hpp"

namespace pt {

void Sampler::fill(std::int64_t step, std::int64_t first, int rows, std::int32_t* inputs,
                   std::int32_t* targets) const {
  const std::uint64_t starts = file_.size() - static_cast<std::uint64_t>(T_); // offsets 0..n-T-1
  for (int r = 0; r < rows; ++r) {
    const std::uint64_t h =
        hash3(seed_, static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(first + r));
    const std::size_t start = h % starts;
    std::int32_t* in = inputs + static_cast<std::size_t>(r) * T_;
    std::int32_t* tg = targets + static_cast<std::size_t>(r) * T_;
    for (int t = 0; t < T_; ++t) {
      in[t] = static_cast<std::int32_t>(file_.at(start + static_cast<std::size_t>(t)));
      tg[t] = static_cast<std::int32_t>(file_.at(start + static_cast<std::size_t>(t) + 1));
    }
  }
}

} // namespace pt
