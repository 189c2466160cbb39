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

// Blocks this size run at one BLAS call's rate on the benchmark model's products (smaller ones
// repack the operands more often: 128 x 512 lost 11% on one thread), and a (2048 x 1152)
// product still has 8 of them for the threads (docs/performance.md, pt_bench_gemm_threads).
constexpr int kBlockRows = 512;
constexpr int kBlockCols = 1024;

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  const int row_blocks = (M + kBlockRows - 1) / kBlockRows;
  const int col_blocks = (N + kBlockCols - 1) / kBlockCols;
  const auto block = [=](std::size_t blk) {
    const int r0 = static_cast<int>(blk) / col_blocks * kBlockRows;
    const int c0 = static_cast<int>(blk) % col_blocks * kBlockCols;
    const int m = std::min(kBlockRows, M - r0), n = std::min(kBlockCols, N - c0);
    // rows r0.. of op(A): rows of A, or columns of A^T; columns c0.. of op(B) likewise
    const float* a = trans_a ? A + r0 : A + static_cast<std::size_t>(r0) * lda;
    const float* b = trans_b ? B + static_cast<std::size_t>(c0) * ldb : B + c0;
    blas_gemm(trans_a, trans_b, m, n, K, alpha, a, lda, b, ldb, beta,
              C + static_cast<std::size_t>(r0) * ldc + c0, ldc);
  };
  const auto blocks = static_cast<std::size_t>(row_blocks) * col_blocks;
  if (blocks == 1) return block(0);
  // the edge blocks are smaller: a dynamic schedule keeps the threads busy to the end
  Kokkos::parallel_for(
      "gemm", Kokkos::RangePolicy<HostSpace, Kokkos::Schedule<Kokkos::Dynamic>>(0, blocks), block);
}

} // namespace pt::ops::detail
