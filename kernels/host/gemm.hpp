// The one matrix product the host kernels call, on the BLAS chosen at configure time
// (PIPETRAIN_BLAS; docs/performance.md has the comparison that made oneDNN the default).
// Row-major: C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C.
#pragma once

#if defined(PT_BLAS_ONEDNN)
#include <dnnl.h>
#include <omp.h>
#else
#include <cblas.h>
#endif

namespace pt::ops::detail {

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
#if defined(PT_BLAS_ONEDNN)
  dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
             ldc);
#else
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

} // namespace pt::ops::detail
