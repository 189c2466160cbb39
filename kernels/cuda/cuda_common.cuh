// What the translation units of the CUDA ops (ops_*.cu) share: the backend's state (one stream,
// the cuBLAS handles, device scratch), the error checks, launch sizes, block reductions, and the
// few host functions one family calls in another's file. Not the public interface (that is
// ops_cuda.hpp): everything here is in pt::cuda_ops::detail, and each ops_*.cu keeps its kernels
// in an anonymous namespace.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace pt::cuda_ops::detail {

using bf16 = __nv_bfloat16;

// Device scratch that grows to the largest request and is reused by calls in stream order.
struct Scratch {
  void* p = nullptr;
  std::size_t bytes = 0;
};

// A block's share of a one-launch pass over many segments of a buffer (adamw_update,
// sum_squares_each): at most kChunk values of segment `seg`, at offset a of one operand and b of
// the other; flag: the segment's option (AdamW: decay).
struct Chunk {
  std::size_t a = 0, b = 0;
  unsigned len = 0, seg = 0;
  int flag = 0;
  bool operator==(const Chunk& o) const {
    return a == o.a && b == o.b && len == o.len && seg == o.seg && flag == o.flag;
  }
};
constexpr unsigned kChunk = 8192;
// A chunk list and its device copy, uploaded again only when the list changes.
struct ChunkTable {
  std::vector<Chunk> host;
  Scratch dev;
};

// A cuBLASLt product with a bias epilogue, planned once per shape and output alignment.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false; // cuBLASLt offered a kernel, and it ran when first used
};
constexpr std::size_t kLtWorkspace = std::size_t{32} << 20;

// device.attention: which kernels attention_forward/backward run at precision bf16
enum class AttentionPath { automatic, cudnn, flash, gemm };

struct Backend {
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  Scratch dp;                  // attention_backward at fp32: dP of one sequence, NH*T*T
  Scratch op_a, op_b;          // bf16 copies of a matrix product's two operands
  Scratch qkv16, dout16, ds16; // attention in bf16: its inputs and dS of one sequence
  Scratch sums;                // sum_squares_each's results
  Scratch rowdot;              // flash attention backward: sum_d dout * out per row, B*NH*T
  Scratch dqkv16;              // cuDNN attention backward: dq, dk, dv in bf16, B*T*3C
  Scratch colsum;              // column sums' per-slice partial sums (ops_norm.cu)
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  void* blas_workspace = nullptr; // cuBLAS's, given at start so that it never allocates one
  Scratch lt_bias;                // the bias, copied to an aligned place
  std::map<std::tuple<int, int, int, int>, LtPlan> lt_plans; // (N, C, OC, output alignment)
  long lt_products = 0;                // forward products whose bias cuBLASLt's epilogue added
  long flash_calls = 0;                // attention calls that took flash_attention.cu's kernels
  ChunkTable adam_chunks, norm_chunks; // adamw_update's and sum_squares_each's
  std::vector<cudaEvent_t> marks;      // mark()'s events; the first marks_used are recorded
  std::size_t marks_used = 0;
  // matrix products: fp32 inputs and outputs; tensor cores with TF32-rounded inputs when asked
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  AttentionPath attention = AttentionPath::automatic;
  bool bf16 = false; // precision "bf16": operands converted to bf16 (see the top of ops_cuda.cu)
};
// The one instance, defined in ops_cuda.cu (init() fills it, finalize() empties it).
extern Backend g;

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
  }
}

inline void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLAS: ") + what + ": status " +
                             std::to_string(static_cast<int>(s)));
  }
}

inline void ready() {
  if (g.stream == nullptr) throw std::runtime_error("CUDA backend used before cuda_ops::init");
}

// A launch error shows at once (a bad configuration); a fault inside a kernel shows at the
// next synchronize().
inline void launched(const char* what) {
  check(cudaGetLastError(), what);
}

// Scratch grows in stream order (cudaFreeAsync after the kernels queued so far, which may still
// use the old block): unlike cudaFree, that never waits for the device's other streams, where
// NCCL transfers may be queued that only a peer's progress completes (comm.gpu_p2p).
template <class T> T* grown(Scratch& s, std::size_t count, const char* what) {
  const std::size_t bytes = count * sizeof(T);
  if (s.bytes < bytes) {
    if (s.p != nullptr) check(cudaFreeAsync(s.p, g.stream), what);
    s = Scratch{};
    check(cudaMallocAsync(&s.p, bytes, g.stream), what);
    s.bytes = bytes;
  }
  return static_cast<T*>(s.p);
}

constexpr int kThreads = 256;

// Appends segment `seg` (n values at offsets a and b) to `out`, cut into chunks of kChunk.
void add_chunks(std::vector<Chunk>& out, std::size_t a, std::size_t b, std::size_t n, unsigned seg,
                int flag);
// The device copy of `chunks` (uploaded into t when they differ from its last list).
const Chunk* device_chunks(ChunkTable& t, const std::vector<Chunk>& chunks, const char* what);

// Whether n floats at each of ps can be read as n / 4 float4s: n a multiple of 4, every pointer
// 16-byte aligned (a null one, an absent operand, is no obstacle).
inline bool by4(std::size_t n, std::initializer_list<const void*> ps) {
  if (n % 4 != 0) return false;
  for (const void* p : ps) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

inline unsigned blocks_for(std::size_t n, int threads = kThreads) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535u * 16u ? (b == 0 ? 1 : b) : 65535u * 16u);
}

// x rounded to the nearest bfloat16 (ties to even), kept in a float: the activation format's
// round, and the bits a product's bf16 conversion gives (kernels/bf16.hpp on the host)
__device__ inline float bf16_value(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// ---- reductions -----------------------------------------------------------------------------

__device__ inline float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ inline float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum (or max) over the block; every thread gets the result. `shared` holds 32 floats.
template <bool Max> __device__ float block_reduce(float x, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  x = Max ? warp_max(x) : warp_sum(x);
  __syncthreads(); // shared may still be read from an earlier call
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  float y = lane < warps ? shared[lane] : (Max ? -INFINITY : 0.0f);
  y = Max ? warp_max(y) : warp_sum(y);
  return y;
}

// ---- column sums and the bias broadcast (ops_norm.cu) ---------------------------------------

// acc (C) += column sums of x (N, C), queued on the stream (matmul_backward_weight's dbias).
void column_sum(float* acc, const float* x, int N, int C);
// out (N, OC) writes = bias (OC) in every row, queued on the stream (matmul_forward's bias).
void broadcast_rows(float* out, const float* bias, int N, int OC);

// ---- matrix products and bf16 copies (ops_gemm.cu) ------------------------------------------

// out (rows x cols, dense) = bf16 of the fp32 matrix at x, rows ld floats apart.
void to_bf16(bf16* out, const float* x, std::size_t rows, int cols, int ld, const char* what);
// A dense bf16 copy (in `s`) of the rows x cols fp32 matrix at x, rows ld floats apart.
const bf16* as_bf16(Scratch& s, const float* x, std::size_t rows, int cols, int ld,
                    const char* what);
// The attention products of one sequence, over its NH heads: fp32 (at g.compute) or bf16.
void gemm_heads(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, int lda,
                long long sa, const void* B, int ldb, long long sb, float beta, void* C,
                cudaDataType_t ctype, int ldc, long long sc, int count, const char* what);
void destroy_plan(LtPlan& p);

} // namespace pt::cuda_ops::detail
