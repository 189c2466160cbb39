// The host kernels' parallel loops (kernels/host/ops_*.cpp), on Kokkos' default host execution
// space.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace pt::ops::detail {

using HostSpace = Kokkos::DefaultHostExecutionSpace;

// Runs f(i) for i in [0, n) on the host execution space (on the calling thread when n < 2, or
// inside another parallel loop: Kokkos runs a nested loop there).
template <class F> void par_for(const char* name, std::size_t n, const F& f) {
  if (n < 2) {
    if (n == 1) f(0);
    return;
  }
  Kokkos::parallel_for(name, Kokkos::RangePolicy<HostSpace>(0, n), f);
}

// Loops over fewer floats than this run on the calling thread: waking the other threads costs
// more than they save (measured: a row loop breaks even at 16-32 K floats on 2 threads;
// docs/architecture.md, "Host threads").
constexpr std::size_t kSerialBelow = 16384;

// f(i) for each of `rows` items of `width` floats each (a row's length).
template <class F>
void par_rows(const char* name, std::size_t rows, std::size_t width, const F& f) {
  if (rows * width < kSerialBelow) {
    for (std::size_t i = 0; i < rows; ++i) f(i);
    return;
  }
  par_for(name, rows, f);
}

// Runs f(begin, end) over chunks of [0, n): the inner loop stays a plain loop the compiler can
// vectorize, whatever the execution space.
constexpr std::size_t kChunk = 8192;
template <class F> void par_chunks(const char* name, std::size_t n, const F& f) {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  par_rows(name, chunks, kChunk, [=](std::size_t c) {
    const std::size_t begin = c * kChunk;
    f(begin, std::min(n, begin + kChunk));
  });
}

// The first kChunk-float chunk of each of `count` arrays, array k of size_of(k) floats, when
// their chunks are numbered in order (count + 1 entries: the last is the number of chunks).
template <class Size> std::vector<std::size_t> chunk_starts(int count, const Size& size_of) {
  std::vector<std::size_t> first(static_cast<std::size_t>(count) + 1, 0);
  for (int k = 0; k < count; ++k) first[k + 1] = first[k] + (size_of(k) + kChunk - 1) / kChunk;
  return first;
}

// Runs f(c, k, begin, end) over every chunk c = [begin, end) of those arrays (first: their
// chunk_starts), all in one parallel loop.
template <class Size, class F>
void par_chunks_each(const char* name, const std::vector<std::size_t>& first, const Size& size_of,
                     const F& f) {
  const std::size_t* starts = first.data();
  const auto count = static_cast<std::ptrdiff_t>(first.size()) - 1;
  par_rows(name, first.back(), kChunk, [=](std::size_t c) {
    const auto k = static_cast<int>(std::upper_bound(starts, starts + count + 1, c) - starts - 1);
    const std::size_t begin = (c - starts[k]) * kChunk;
    f(c, k, begin, std::min(size_of(k), begin + kChunk));
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
