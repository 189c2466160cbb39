// Deterministic sampler: the sequences of a step are a pure function of (seed, step, sample
// index), so any data-parallel layout that splits the same global batch sees the same data, and
// a restart at step s continues exactly (the cursor saved in checkpoints is the step).
#pragma once

#include <cstdint>

#include "data/token_file.hpp"

namespace pt {

class Sampler {
public:
  Sampler(const TokenFile& file, int seq_len, std::uint64_t seed)
      : file_(file), T_(seq_len), seed_(seed) {}

  // Global sample `sample` of step `step`: T+1 consecutive tokens from a pseudo-random offset.
  // inputs, targets (rows, T) for samples [first, first + rows).
  void fill(std::int64_t step, std::int64_t first, int rows, std::int32_t* inputs,
            std::int32_t* targets) const;

private:
  const TokenFile& file_;
  int T_;
  std::uint64_t seed_;
};

} // namespace pt
