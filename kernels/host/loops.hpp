// The host kernels' parallel loops (kernels/host/ops_*.cpp), on Kokkos' default host execution
// space.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>

namespace pt::ops::detail {

using HostSpace = Kokkos::DefaultHostExecutionSpace;

// Runs f(i) for i in [0, n) on the host execution space.
template <class F> void par_for(const char* name, std::size_t n, const F& f) {
  Kokkos::parallel_for(name, Kokkos::RangePolicy<HostSpace>(0, n), f);
}

// Runs f(begin, end) over chunks of [0, n): the inner loop stays a plain loop the compiler can
// vectorize, whatever the execution space.
constexpr std::size_t kChunk = 8192;
template <class F> void par_chunks(const char* name, std::size_t n, const F& f) {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  par_for(name, chunks, [=](std::size_t c) {
    const std::size_t begin = c * kChunk;
    f(begin, std::min(n, begin + kChunk));
  });
}

// Column-blocked reduction over rows: f(col_begin, col_end) owns those columns, so threads never
// write the same gradient entry.
constexpr int kColBlock = 64;
template <class F> void par_col_blocks(const char* name, int C, const F& f) {
  const int blocks = (C + kColBlock - 1) / kColBlock;
  par_for(name, blocks, [=](std::size_t blk) {
    const int begin = static_cast<int>(blk) * kColBlock;
    f(begin, std::min(C, begin + kColBlock));
  });
}

} // namespace pt::ops::detail
