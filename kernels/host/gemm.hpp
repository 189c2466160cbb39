// The one matrix product the host kernels call, on the BLAS chosen at configure time
// (PIPETRAIN_BLAS; docs/performance.md has the comparison that made oneDNN the default).
// Row-major: C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C.
//
// Threads never share an output element: C is cut into blocks of at most kBlockRows x
// kBlockCols, a grid fixed by the shape alone, and each block is one single-threaded BLAS call
// on a thread of the host execution space, threads taking the next free block. The inner
// dimension K is never split, so every element is summed in the same order at 1 or N threads
// (docs/architecture.md, "Host threads").
#pragma once

#include <algorithm>

#if defined(PT_BLAS_ONEDNN)
#include <dnnl.h>
#else
#include <cblas.h>
#endif

#include "host/loops.hpp"

namespace pt::ops::detail {

inline void blas_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                      int lda, const float* B, int ldb, float beta, float* C, int ldc) {
#if defined(PT_BLAS_ONEDNN)
  dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
             ldc);
#else
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

// The grid of blocks, fixed by the shape alone. Each dimension is cut into the fewest equal
// blocks of at most kBlockRows x kBlockCols (multiples of 16 floats but the last): blocks this
// size run at one BLAS call's rate on the benchmark model's products (smaller ones repack the
// operands more often: 128 x 512 lost 11% on one thread). A product of fewer than kMinBlocks
// blocks is cut further, one more block along its longer block side while that side is at
// least 2 kMinSide, so that a few threads share even the weight gradients, (384 x 384) outputs
// summed over 2048 tokens (docs/performance.md, pt_bench_gemm_threads).
constexpr int kBlockRows = 512;
constexpr int kBlockCols = 1024;
constexpr int kMinBlocks = 4;
constexpr int kMinSide = 192;

struct Grid {
  int rows, cols; // block counts
  int block_rows, block_cols;
};

inline int even_side(int extent, int count) {
  return ((extent + count - 1) / count + 15) & ~15;
}

inline Grid gemm_grid(int M, int N) {
  Grid g{(M + kBlockRows - 1) / kBlockRows, (N + kBlockCols - 1) / kBlockCols, 0, 0};
  for (;;) {
    g.block_rows = even_side(M, g.rows);
    g.block_cols = even_side(N, g.cols);
    if (g.rows * g.cols >= kMinBlocks) break;
    if (g.block_rows >= g.block_cols && g.block_rows >= 2 * kMinSide) {
      ++g.rows;
    } else if (g.block_cols >= 2 * kMinSide) {
      ++g.cols;
    } else {
      break;
    }
  }
  return g;
}

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  const Grid g = gemm_grid(M, N);
  const auto block = [=](std::size_t blk) {
    const int r0 = static_cast<int>(blk) / g.cols * g.block_rows;
    const int c0 = static_cast<int>(blk) % g.cols * g.block_cols;
    const int m = std::min(g.block_rows, M - r0), n = std::min(g.block_cols, N - c0);
    if (m <= 0 || n <= 0) return; // rounding up to 16 can leave a last block empty
    // rows r0.. of op(A): rows of A, or columns of A^T; columns c0.. of op(B) likewise
    const float* a = trans_a ? A + r0 : A + static_cast<std::size_t>(r0) * lda;
    const float* b = trans_b ? B + static_cast<std::size_t>(c0) * ldb : B + c0;
    blas_gemm(trans_a, trans_b, m, n, K, alpha, a, lda, b, ldb, beta,
              C + static_cast<std::size_t>(r0) * ldc + c0, ldc);
  };
  const auto blocks = static_cast<std::size_t>(g.rows) * g.cols;
  if (blocks == 1) return block(0);
  // the edge blocks can be smaller: a dynamic schedule keeps the threads busy to the end
  Kokkos::parallel_for(
      "gemm", Kokkos::RangePolicy<HostSpace, Kokkos::Schedule<Kokkos::Dynamic>>(0, blocks), block);
}

} // namespace pt::ops::detail
