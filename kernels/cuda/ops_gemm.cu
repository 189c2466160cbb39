// Matrix products (kernels/cuda/ops_cuda.hpp: matmul_*, measure_gemm_flops) through cuBLAS and,
// for a forward product with a bias at precision bf16, cuBLASLt; the bf16 copies of their
// operands; and the batched products over heads that attention (ops_attention.cu) runs.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>

#include "cuda/cuda_common.cuh"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda_ops {
using namespace detail;

namespace {

// out = bf16 of in, n4 groups of 4 (dense, 16-byte aligned input)
__global__ void to_bf16_vec_k(__nv_bfloat162* out, const float4* in, std::size_t n4) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float4 v = in[i];
    out[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    out[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

// out (rows x cols, dense) = bf16 of in (rows x cols, rows ld floats apart)
__global__ void to_bf16_k(bf16* out, const float* in, std::size_t rows, int cols, int ld) {
  const std::size_t total = rows * static_cast<std::size_t>(cols);
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = i / static_cast<std::size_t>(cols);
    const std::size_t c = i - r * static_cast<std::size_t>(cols);
    out[i] = __float2bfloat16(in[r * static_cast<std::size_t>(ld) + c]);
  }
}

// A row-major matrix operand: its data, its element type, and the distance between its rows.
struct Operand {
  const void* p;
  cudaDataType_t type;
  int ld;
};

// Row-major C(M,N) = alpha * op(A) op(B) + beta * C over `count` problems whose matrices start
// sa, sb, sc elements apart (count 1: a plain product): column-major, that is
// C^T = op(B)^T-stored times op(A)^T-stored. alpha and beta are float (fp32 accumulation).
void gemm_typed(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, long long sa,
                Operand B, long long sb, float beta, void* C, cudaDataType_t ctype, int ldc,
                long long sc, int count, cublasComputeType_t compute, const char* what) {
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (count == 1) {
    check(cublasGemmEx(g.blas, opb, opa, N, M, K, &alpha, B.p, B.type, B.ld, A.p, A.type, A.ld,
                       &beta, C, ctype, ldc, compute, CUBLAS_GEMM_DEFAULT),
          what);
  } else {
    check(cublasGemmStridedBatchedEx(g.blas, opb, opa, N, M, K, &alpha, B.p, B.type, B.ld, sb, A.p,
                                     A.type, A.ld, sa, &beta, C, ctype, ldc, sc, count, compute,
                                     CUBLAS_GEMM_DEFAULT),
          what);
  }
}

} // namespace

namespace detail {

// out (rows x cols, dense) = bf16 of the fp32 matrix at x, rows ld floats apart.
void to_bf16(bf16* out, const float* x, std::size_t rows, int cols, int ld, const char* what) {
  const std::size_t n = rows * static_cast<std::size_t>(cols);
  if (ld == cols && n % 4 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<std::uintptr_t>(out) % 4 == 0) {
    to_bf16_vec_k<<<blocks_for(n / 4), kThreads, 0, g.stream>>>(
        reinterpret_cast<__nv_bfloat162*>(out), reinterpret_cast<const float4*>(x), n / 4);
  } else {
    to_bf16_k<<<blocks_for(n), kThreads, 0, g.stream>>>(out, x, rows, cols, ld);
  }
  launched(what);
}

// A dense bf16 copy (in `s`) of the rows x cols fp32 matrix at x, rows ld floats apart.
const bf16* as_bf16(Scratch& s, const float* x, std::size_t rows, int cols, int ld,
                    const char* what) {
  bf16* out = grown<bf16>(s, rows * static_cast<std::size_t>(cols), what);
  to_bf16(out, x, rows, cols, ld, what);
  return out;
}

// The attention products of one sequence, over its NH heads: fp32 (at g.compute) or bf16.
void gemm_heads(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, int lda,
                long long sa, const void* B, int ldb, long long sb, float beta, void* C,
                cudaDataType_t ctype, int ldc, long long sc, int count, const char* what) {
  const cudaDataType_t in = g.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  gemm_typed(ta, tb, M, N, K, alpha, {A, in, lda}, sa, {B, in, ldb}, sb, beta, C, ctype, ldc, sc,
             count, g.bf16 ? CUBLAS_COMPUTE_32F : g.compute, what);
}

void destroy_plan(LtPlan& p) {
  if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d}) {
    if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
  }
  p = LtPlan{};
}

} // namespace detail

namespace {

// Row-major C(M,N) = alpha * op(A) op(B) + beta * C with row-major fp32 A, B, C (as the host's
// gemm). At precision bf16 the two operands go through bf16 copies.
void gemm_rm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
             const float* B, int ldb, float beta, float* C, int ldc, const char* what) {
  if (!g.bf16) {
    gemm_typed(ta, tb, M, N, K, alpha, {A, CUDA_R_32F, lda}, 0, {B, CUDA_R_32F, ldb}, 0, beta, C,
               CUDA_R_32F, ldc, 0, 1, g.compute, what);
    return;
  }
  const int a_cols = ta ? M : K, b_cols = tb ? K : N;
  const bf16* a = as_bf16(g.op_a, A, static_cast<std::size_t>(ta ? K : M), a_cols, lda, what);
  const bf16* b = as_bf16(g.op_b, B, static_cast<std::size_t>(tb ? N : K), b_cols, ldb, what);
  gemm_typed(ta, tb, M, N, K, alpha, {a, CUDA_R_16BF, a_cols}, 0, {b, CUDA_R_16BF, b_cols}, 0, beta,
             C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, what);
}

// The largest power of two (up to 256) that divides the address.
int alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  int k = 1;
  while (k < 256 && a % (2 * k) == 0) k *= 2;
  return k;
}

// Column-major D (OC x N, fp32) = A^T (A stored C x OC: w, row-major OC x C) times B (stored
// C x N: inp, row-major N x C) plus the bias per row of D (per output column of out).
bool make_plan(LtPlan& p, int N, int C, int OC, int align) {
  const auto ok = [](cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; };
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  if (!ok(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
      !ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
      !ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ||
      !ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                         sizeof epilogue)) ||
      !ok(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, static_cast<std::uint64_t>(C),
                                     static_cast<std::uint64_t>(OC), C)) ||
      !ok(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, static_cast<std::uint64_t>(C),
                                     static_cast<std::uint64_t>(N), C)) ||
      !ok(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, static_cast<std::uint64_t>(OC),
                                     static_cast<std::uint64_t>(N), OC))) {
    return false;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  if (!ok(cublasLtMatmulPreferenceCreate(&pref))) return false;
  const std::uint64_t ws = kLtWorkspace;
  const std::uint32_t al = static_cast<std::uint32_t>(align);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const bool asked =
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof ws)) &&
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
                                              sizeof al)) &&
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
                                              sizeof al)) &&
      ok(cublasLtMatmulAlgoGetHeuristic(g.lt, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (!asked || found == 0 || result.state != CUBLAS_STATUS_SUCCESS) return false;
  p.algo = result.algo;
  return true;
}

// out (N x OC) = inp (N x C, bf16) @ w (OC x C, bf16)^T + bias in one cuBLASLt call, the bias
// added in the epilogue. False where cuBLASLt has no kernel for it: the caller then does it the
// plain way.
bool lt_bias_product(float* out, const bf16* inp, const bf16* w, const float* bias, int N, int C,
                     int OC) {
  const int align = alignment(out);
  if (align < 16) return false;
  const auto key = std::make_tuple(N, C, OC, align);
  auto it = g.lt_plans.find(key);
  if (it == g.lt_plans.end()) {
    LtPlan plan;
    if (!make_plan(plan, N, C, OC, align)) destroy_plan(plan);
    it = g.lt_plans.emplace(key, plan).first;
    it->second.ok = it->second.op != nullptr;
  }
  LtPlan& plan = it->second;
  if (!plan.ok) return false;
  float* b = grown<float>(g.lt_bias, static_cast<std::size_t>(OC), "matmul_forward bias");
  check(cudaMemcpyAsync(b, bias, sizeof(float) * static_cast<std::size_t>(OC),
                        cudaMemcpyDeviceToDevice, g.stream),
        "matmul_forward bias");
  const float alpha = 1.0f, beta = 0.0f;
  if (cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmul(g.lt, plan.op, &alpha, w, plan.a, inp, plan.b, &beta, out, plan.d, out, plan.d,
                     &plan.algo, g.lt_workspace, kLtWorkspace, g.stream) != CUBLAS_STATUS_SUCCESS) {
    plan.ok = false; // not again for this shape; nothing was written
    return false;
  }
  ++g.lt_products;
  return true;
}

} // namespace

double measure_gemm_flops(double seconds) {
  ready();
  constexpr int n = 4096; // large enough to run at the tensor cores' rate
  // at bf16 the product the ops run after converting: bf16 inputs, fp32 result
  const cudaDataType_t in = g.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = g.bf16 ? CUBLAS_COMPUTE_32F : g.compute;
  const std::size_t in_bytes = (g.bf16 ? sizeof(bf16) : sizeof(float)) * n * n;
  void* a = alloc(in_bytes);
  void* b = alloc(in_bytes);
  void* c = alloc(sizeof(float) * n * n);
  check(cudaMemsetAsync(a, 0, in_bytes, g.stream), "cudaMemset");
  check(cudaMemsetAsync(b, 0, in_bytes, g.stream), "cudaMemset");
  const auto product = [&] {
    gemm_typed(false, true, n, n, n, 1.0f, {a, in, n}, 0, {b, in, n}, 0, 0.0f, c, CUDA_R_32F, n, 0,
               1, compute, "measure_gemm_flops");
  };
  product();
  synchronize(); // the first call picks the algorithm
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  int reps = 1;
  float ms = 0.0f;
  for (;;) {
    check(cudaEventRecord(start, g.stream), "cudaEventRecord");
    for (int r = 0; r < reps; ++r) product();
    check(cudaEventRecord(stop, g.stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (ms >= 1e3 * seconds || reps >= 1 << 12) break;
    reps *= 2;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  release(a);
  release(b);
  release(c);
  return 2.0 * n * n * static_cast<double>(n) * reps / (1e-3 * ms);
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                    int OC) {
  ready();
  if (N == 0 || OC == 0) return;
  if (g.bf16 && bias != nullptr) {
    const bf16* a = as_bf16(g.op_a, inp, static_cast<std::size_t>(N), C, C, "matmul_forward");
    const bf16* b = as_bf16(g.op_b, w, static_cast<std::size_t>(OC), C, C, "matmul_forward");
    if (lt_bias_product(out, a, b, bias, N, C, OC)) return;
    // no cuBLASLt kernel: the bias broadcast, then the product over it (converting again)
  }
  float beta = 0.0f;
  if (bias != nullptr) {
    broadcast_rows(out, bias, N, OC);
    launched("matmul_forward bias");
    beta = 1.0f;
  }
  gemm_rm(false, true, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC, "matmul_forward");
}

void matmul_backward_input(float* dinp, const float* dout, const float* w, int N, int C, int OC) {
  ready();
  if (N == 0 || C == 0) return;
  gemm_rm(false, false, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C, "matmul_backward_input");
}

void matmul_backward_weight(float* dw, float* dbias, const float* dout, const float* inp, int N,
                            int C, int OC) {
  ready();
  if (N == 0 || OC == 0) return;
  gemm_rm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C, "matmul_backward_weight");
  if (dbias != nullptr) {
    column_sum(dbias, dout, N, OC);
    launched("matmul_backward_weight bias");
  }
}

// At bf16 the products of matmul_backward_input and _weight on one bf16 copy of dout (gemm_rm
// would convert it for each); the same calls, so the same results.
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC) {
  ready();
  if (!g.bf16 || N == 0 || C == 0 || OC == 0) {
    matmul_backward_input(dinp, dout, w, N, C, OC);
    matmul_backward_weight(dw, dbias, dout, inp, N, C, OC);
    return;
  }
  const char* what = "matmul_backward";
  const auto rows = static_cast<std::size_t>(N);
  const bf16* d16 = as_bf16(g.op_a, dout, rows, OC, OC, what);
  const bf16* w16 = as_bf16(g.op_b, w, static_cast<std::size_t>(OC), C, C, what);
  gemm_typed(false, false, N, C, OC, 1.0f, {d16, CUDA_R_16BF, OC}, 0, {w16, CUDA_R_16BF, C}, 0,
             0.0f, dinp, CUDA_R_32F, C, 0, 1, CUBLAS_COMPUTE_32F, what);
  // op_b again: queued after the product above, which has then read w16
  const bf16* in16 = as_bf16(g.op_b, inp, rows, C, C, what);
  gemm_typed(true, false, OC, C, N, 1.0f, {d16, CUDA_R_16BF, OC}, 0, {in16, CUDA_R_16BF, C}, 0,
             1.0f, dw, CUDA_R_32F, C, 0, 1, CUBLAS_COMPUTE_32F, what);
  if (dbias != nullptr) {
    column_sum(dbias, dout, N, OC);
    launched("matmul_backward bias");
  }
}

// The products above with their activation operand packed in bf16: the same cuBLAS calls on it as
// it is, where matmul_forward and matmul_backward convert a copy (the same bits when the fp32
// operand held the packed values widened). Precision bf16 only: the model calls them where
// bf16_products() holds.
namespace {

const bf16* packed_operand(const std::uint16_t* inp, const char* what) {
  if (!g.bf16) throw std::logic_error(std::string(what) + ": needs precision bf16");
  return reinterpret_cast<const bf16*>(inp);
}

} // namespace

void matmul_forward_packed(float* out, const std::uint16_t* inp, const float* w, const float* bias,
                           int N, int C, int OC) {
  ready();
  if (N == 0 || OC == 0) return;
  const char* what = "matmul_forward_packed";
  const bf16* a = packed_operand(inp, what);
  const bf16* b = as_bf16(g.op_b, w, static_cast<std::size_t>(OC), C, C, what);
  if (bias != nullptr && lt_bias_product(out, a, b, bias, N, C, OC)) return;
  float beta = 0.0f;
  if (bias != nullptr) {
    broadcast_rows(out, bias, N, OC);
    launched("matmul_forward_packed bias");
    beta = 1.0f;
  }
  gemm_typed(false, true, N, OC, C, 1.0f, {a, CUDA_R_16BF, C}, 0, {b, CUDA_R_16BF, C}, 0, beta, out,
             CUDA_R_32F, OC, 0, 1, CUBLAS_COMPUTE_32F, what);
}

void matmul_backward_packed(float* dinp, float* dw, float* dbias, const float* dout,
                            const std::uint16_t* inp, const float* w, int N, int C, int OC) {
  ready();
  if (N == 0 || C == 0 || OC == 0) return;
  const char* what = "matmul_backward_packed";
  const bf16* in16 = packed_operand(inp, what);
  const bf16* d16 = as_bf16(g.op_a, dout, static_cast<std::size_t>(N), OC, OC, what);
  if (dinp != nullptr) {
    const bf16* w16 = as_bf16(g.op_b, w, static_cast<std::size_t>(OC), C, C, what);
    gemm_typed(false, false, N, C, OC, 1.0f, {d16, CUDA_R_16BF, OC}, 0, {w16, CUDA_R_16BF, C}, 0,
               0.0f, dinp, CUDA_R_32F, C, 0, 1, CUBLAS_COMPUTE_32F, what);
  }
  gemm_typed(true, false, OC, C, N, 1.0f, {d16, CUDA_R_16BF, OC}, 0, {in16, CUDA_R_16BF, C}, 0,
             1.0f, dw, CUDA_R_32F, C, 0, 1, CUBLAS_COMPUTE_32F, what);
  if (dbias != nullptr) {
    column_sum(dbias, dout, N, OC);
    launched("matmul_backward_packed bias");
  }
}

} // namespace pt::cuda_ops
