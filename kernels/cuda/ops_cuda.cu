// CUDA implementation of kernels/cuda/ops_cuda.hpp (the ops of kernels/ops.hpp on a GPU).
// Per-row work (layer norm, softmax, cross-entropy) takes one warp or one block per row;
// column sums over rows take a block per group of columns and add their partial sums with
// atomics; every matrix product is one cuBLAS call (attention: one strided-batched call per
// sequence over its heads). cuBLAS is column-major: a row-major (R,C) matrix is a column-major
// (C,R) one, so out = inp @ w^T becomes out^T = w^T-as-stored times inp^T-as-stored.
//
// Precision "bf16": a matrix product converts its two fp32 operands to bf16 copies (device
// scratch) and runs cuBLAS on bf16 inputs with fp32 accumulation and an fp32 result. Attention
// converts q, k, v (and the incoming gradient) once per call, keeps its probabilities P in bf16
// inside the att buffer (which then holds B*NH*T*T bf16 values, not floats: only this backend
// reads it), and has cuBLAS write dP in bf16, over which the softmax backward writes dS; where
// flash_attention.hpp takes the shape (GPT-2's head size 64), its kernels run instead and att
// holds each score row's log-sum-exp and bf16 copies of qkv and the output, no (T, T) matrix. A
// forward product with a bias adds it in cuBLASLt's epilogue (no broadcast pass, no fp32 read
// of the result) where cuBLASLt offers that, and falls back to the broadcast otherwise.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "cuda/flash_attention.hpp"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda_ops {
namespace {

using bf16 = __nv_bfloat16;

// Device scratch that grows to the largest request and is reused by calls in stream order.
struct Scratch {
  void* p = nullptr;
  std::size_t bytes = 0;
};

// A cuBLASLt product with a bias epilogue, planned once per shape and output alignment.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false; // cuBLASLt offered a kernel, and it ran when first used
};
constexpr std::size_t kLtWorkspace = std::size_t{32} << 20;

struct Backend {
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  Scratch dp;                  // attention_backward at fp32: dP of one sequence, NH*T*T
  Scratch op_a, op_b;          // bf16 copies of a matrix product's two operands
  Scratch qkv16, dout16, ds16; // attention in bf16: its inputs and dS of one sequence
  Scratch sums;                // sum_squares_each's results
  Scratch rowdot;              // flash attention backward: sum_d dout * out per row, B*NH*T
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  void* blas_workspace = nullptr; // cuBLAS's, given at start so that it never allocates one
  Scratch lt_bias;                // the bias, copied to an aligned place
  std::map<std::tuple<int, int, int, int>, LtPlan> lt_plans; // (N, C, OC, output alignment)
  long lt_products = 0; // forward products whose bias cuBLASLt's epilogue added
  long flash_calls = 0; // attention calls that took flash_attention.cu's kernels
  // matrix products: fp32 inputs and outputs; tensor cores with TF32-rounded inputs when asked
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  bool bf16 = false; // precision "bf16": operands converted to bf16 (see the top of this file)
};
Backend g;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
  }
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLAS: ") + what + ": status " +
                             std::to_string(static_cast<int>(s)));
  }
}

void ready() {
  if (g.stream == nullptr) throw std::runtime_error("CUDA backend used before cuda_ops::init");
}

// A launch error shows at once (a bad configuration); a fault inside a kernel shows at the
// next synchronize().
void launched(const char* what) {
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

void free_scratch(Scratch& s) {
  if (s.p != nullptr) cudaFreeAsync(s.p, g.stream);
  s = Scratch{};
}

constexpr int kThreads = 256;
constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f; // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

// Whether n floats at each of ps can be read as n / 4 float4s: n a multiple of 4, every pointer
// 16-byte aligned (a null one, an absent operand, is no obstacle).
bool by4(std::size_t n, std::initializer_list<const void*> ps) {
  if (n % 4 != 0) return false;
  for (const void* p : ps) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

unsigned blocks_for(std::size_t n, int threads = kThreads) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535u * 16u ? (b == 0 ? 1 : b) : 65535u * 16u);
}

// ---- reductions -----------------------------------------------------------------------------

__device__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ float warp_max(float x) {
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

__device__ float load(float x) {
  return x;
}
__device__ float load(bf16 x) {
  return __bfloat162float(x);
}
__device__ void store(float* p, float x) {
  *p = x;
}
__device__ void store(bf16* p, float x) {
  *p = __float2bfloat16(x); // round to nearest even
}

// ---- kernels --------------------------------------------------------------------------------

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

__global__ void encoder_forward_k(float* out, const int32_t* tokens, const float* wte,
                                  const float* wpe, int BT, int T, int C, int v_begin, int v_end) {
  const std::size_t total = static_cast<std::size_t>(BT) * C;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    const int tok = tokens[bt];
    float o = 0.0f;
    if (tok >= v_begin && tok < v_end) o = wte[static_cast<std::size_t>(tok - v_begin) * C + c];
    if (wpe != nullptr) o += wpe[static_cast<std::size_t>(t) * C + c];
    out[i] = o;
  }
}

__global__ void encoder_backward_k(float* dwte, float* dwpe, const float* dout,
                                   const int32_t* tokens, int BT, int T, int C, int v_begin,
                                   int v_end) {
  const std::size_t total = static_cast<std::size_t>(BT) * C;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int tok = tokens[bt];
    const float d = dout[i];
    if (tok >= v_begin && tok < v_end) {
      atomicAdd(dwte + static_cast<std::size_t>(tok - v_begin) * C + c, d);
    }
    if (dwpe != nullptr) atomicAdd(dwpe + (bt % T) * C + c, d);
  }
}

// Row element access for the layer norms: Vec reads 4 floats per load (C a multiple of 4, every
// row 16-byte aligned), so that a lane has 4 loads in flight where it had one.
template <bool Vec> struct Row {
  static constexpr int kStep = Vec ? 4 : 1;
  __device__ static float4 get(const float* x, int c) {
    if constexpr (Vec) {
      return *reinterpret_cast<const float4*>(x + c);
    } else {
      return make_float4(x[c], 0.0f, 0.0f, 0.0f);
    }
  }
  __device__ static void put(float* x, int c, const float4& v) {
    if constexpr (Vec) {
      *reinterpret_cast<float4*>(x + c) = v;
    } else {
      x[c] = v.x;
    }
  }
};

// one warp per row; the lane's columns are c, c + 1, .. c + kStep - 1 for c = lane * kStep, ...
template <bool Vec>
__global__ void layernorm_forward_k(float* out, float* mean, float* rstd, const float* inp,
                                    const float* w, const float* b, int N, int C) {
  using R = Row<Vec>;
  constexpr int k = R::kStep;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<std::size_t>(row) * C;
  float s = 0.0f;
  for (int c = lane * k; c < C; c += 32 * k) {
    const float4 v = R::get(x, c);
    s += Vec ? (v.x + v.y) + (v.z + v.w) : v.x;
  }
  const float m = warp_sum(s) / C;
  float var = 0.0f;
  for (int c = lane * k; c < C; c += 32 * k) {
    const float4 v = R::get(x, c);
    var += Vec ? ((v.x - m) * (v.x - m) + (v.y - m) * (v.y - m)) +
                     ((v.z - m) * (v.z - m) + (v.w - m) * (v.w - m))
               : (v.x - m) * (v.x - m);
  }
  const float r = rsqrtf(warp_sum(var) / C + kLayerNormEps);
  float* o = out + static_cast<std::size_t>(row) * C;
  for (int c = lane * k; c < C; c += 32 * k) {
    const float4 v = R::get(x, c), wc = R::get(w, c), bc = R::get(b, c);
    R::put(o, c,
           make_float4((v.x - m) * r * wc.x + bc.x, (v.y - m) * r * wc.y + bc.y,
                       (v.z - m) * r * wc.z + bc.z, (v.w - m) * r * wc.w + bc.w));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

template <bool Vec>
__global__ void layernorm_backward_input_k(float* dinp, const float* dout, const float* inp,
                                           const float* w, const float* mean, const float* rstd,
                                           int N, int C) {
  using R = Row<Vec>;
  constexpr int k = R::kStep;
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const float* x = inp + off;
  const float* d = dout + off;
  const float m = mean[row], r = rstd[row];
  float a = 0.0f, an = 0.0f;
  for (int c = lane * k; c < C; c += 32 * k) {
    const float4 xv = R::get(x, c), dv = R::get(d, c), wv = R::get(w, c);
    const float dn[4] = {dv.x * wv.x, dv.y * wv.y, dv.z * wv.z, dv.w * wv.w};
    const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int j = 0; j < k; ++j) {
      a += dn[j];
      an += dn[j] * (xs[j] - m) * r;
    }
  }
  const float dnorm_mean = warp_sum(a) / C, dnorm_norm_mean = warp_sum(an) / C;
  float* dx = dinp + off;
  auto grad = [&](float dn, float xj) {
    return (dn - dnorm_mean - (xj - m) * r * dnorm_norm_mean) * r;
  };
  for (int c = lane * k; c < C; c += 32 * k) {
    const float4 xv = R::get(x, c), dv = R::get(d, c), wv = R::get(w, c), old = R::get(dx, c);
    R::put(dx, c,
           make_float4(old.x + grad(dv.x * wv.x, xv.x), old.y + grad(dv.y * wv.y, xv.y),
                       old.z + grad(dv.z * wv.z, xv.z), old.w + grad(dv.w * wv.w, xv.w)));
  }
}

// Column sums over rows: block (x: 32 columns, y: a slice of the rows), partial sums added with
// atomics. f(row, col) is the term.
constexpr int kRowSlices = 64;
template <class F> __device__ void column_sums(float* acc, int N, int C, const F& f) {
  __shared__ float part[kThreads];
  const int c = blockIdx.x * 32 + threadIdx.x % 32;
  const int lanes_y = blockDim.x / 32;
  const int per = (N + gridDim.y - 1) / gridDim.y;
  const int r0 = blockIdx.y * per, r1 = min(N, r0 + per);
  float s = 0.0f;
  if (c < C) {
    for (int r = r0 + threadIdx.x / 32; r < r1; r += lanes_y) s += f(r, c);
  }
  __syncthreads(); // part may still be read by an earlier call in this kernel
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x < 32 && c < C) {
    float t = 0.0f;
    for (int k = threadIdx.x; k < blockDim.x; k += 32) t += part[k];
    atomicAdd(acc + c, t);
  }
}

struct Element { // x[r, c]
  const float* x;
  int C;
  __device__ float operator()(int r, int c) const { return x[static_cast<std::size_t>(r) * C + c]; }
};

struct NormTimesGrad { // dout[r, c] * (inp[r, c] - mean[r]) * rstd[r]
  const float *dout, *inp, *mean, *rstd;
  int C;
  __device__ float operator()(int r, int c) const {
    const std::size_t i = static_cast<std::size_t>(r) * C + c;
    return dout[i] * (inp[i] - mean[r]) * rstd[r];
  }
};

__global__ void layernorm_backward_weight_k(float* dw, float* db, const float* dout,
                                            const float* inp, const float* mean, const float* rstd,
                                            int N, int C) {
  column_sums(dw, N, C, NormTimesGrad{dout, inp, mean, rstd, C});
  column_sums(db, N, C, Element{dout, C});
}

__global__ void column_sum_k(float* acc, const float* x, int N, int C) {
  column_sums(acc, N, C, Element{x, C});
}

__global__ void broadcast_rows_k(float* out, const float* bias, int N, int OC) {
  const std::size_t total = static_cast<std::size_t>(N) * OC;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = bias[i % OC];
  }
}

// Causal softmax of each (T,T) row in place: row i keeps columns 0..i, the rest become zero.
// One block per row of all B*NH*T rows. E: float, or bf16 (computed in float, stored rounded).
template <class E> __global__ void causal_softmax_k(E* att, int T) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const int i = static_cast<int>(row % T);
  E* p = att + row * T;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, load(p[j]));
  mx = block_reduce<true>(mx, shared);
  float s = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) s += expf(load(p[j]) - mx);
  s = block_reduce<false>(s, shared);
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    store(p + j, j <= i ? expf(load(p[j]) - mx) * inv : 0.0f);
  }
}

// dS = P * (dP - sum_j P dP) in place over dP, row by row (causal: zero above the diagonal).
// E: float, or bf16 (dP and P rounded to bf16, the arithmetic in float).
template <class E> __global__ void causal_softmax_backward_k(E* ds, const E* att, int T) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const int i = static_cast<int>(row % T);
  const E* p = att + row * T;
  E* d = ds + row * T;
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) dot += load(p[j]) * load(d[j]);
  dot = block_reduce<false>(dot, shared);
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    store(d + j, j <= i ? load(p[j]) * (load(d[j]) - dot) : 0.0f);
  }
}

// ---- elementwise maps: out[i] = f(a[i], b[i]) (b absent: f(a[i], 0)), 4 floats at a time where
// n and every pointer allow it (one 16-byte load per operand: fewer instructions in flight per
// byte, which is what these memory-bound loops wait on)

struct Gelu { // tanh approximation, as the host and GPT-2
  __device__ float operator()(float x, float) const {
    const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    return 0.5f * x * (1.0f + t);
  }
};

struct GeluGrad { // d gelu(x) / dx times the incoming gradient d
  __device__ float operator()(float x, float d) const {
    const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    return d * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
};

struct Axpby { // add: 1, 1; accumulate: out = x = acc; scale: b = 0, no y
  float a, b;
  __device__ float operator()(float x, float y) const { return a * x + b * y; }
};

template <class F>
__global__ void map_k(float* out, const float* a, const float* b, std::size_t n, F f) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = f(a[i], b != nullptr ? b[i] : 0.0f);
  }
}

template <class F>
__global__ void map4_k(float4* out, const float4* a, const float4* b, std::size_t n4, F f) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float4 x = a[i], y = b != nullptr ? b[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    out[i] = make_float4(f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w));
  }
}

__global__ void sum_squares_k(double* total, const float* x, std::size_t n) {
  __shared__ float shared[32];
  float s = 0.0f; // per thread in float, blocks summed in double (as the host's chunks)
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    s += x[i] * x[i];
  }
  s = block_reduce<false>(s, shared);
  if (threadIdx.x == 0) atomicAdd(total, static_cast<double>(s));
}

// One block per row: softmax of the logits, and the loss in log-sum-exp form. The logits are
// read twice: once for the maximum and the sum together (each thread keeps a running maximum
// and rescales its sum when it grows), once to write the probabilities. Vec: 4 logits per load
// (V a multiple of 4, rows 16-byte aligned).
template <bool Vec>
__global__ void crossentropy_forward_k(float* losses, float* probs, const float* logits,
                                       const int32_t* targets, int V) {
  __shared__ float shared[32];
  const std::size_t n = blockIdx.x;
  const float* z = logits + n * V;
  float* p = probs + n * V;
  const float z_target = z[targets[n]]; // read before p may overwrite z
  float m = -INFINITY, s = 0.0f;
  auto add = [&](float x) { // x <= m
    s += expf(x - m);
  };
  if constexpr (Vec) {
    const float4* z4 = reinterpret_cast<const float4*>(z);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 x = z4[i];
      const float mx = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
      if (mx > m) {
        s *= expf(m - mx);
        m = mx;
      }
      add(x.x);
      add(x.y);
      add(x.z);
      add(x.w);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float x = z[i];
      if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
      } else {
        add(x);
      }
    }
  }
  const float mx = block_reduce<true>(m, shared);
  s = block_reduce<false>(m == -INFINITY ? 0.0f : s * expf(m - mx), shared);
  const float inv = 1.0f / s;
  if constexpr (Vec) {
    const float4* z4 = reinterpret_cast<const float4*>(z);
    float4* p4 = reinterpret_cast<float4*>(p);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 x = z4[i];
      p4[i] = make_float4(expf(x.x - mx) * inv, expf(x.y - mx) * inv, expf(x.z - mx) * inv,
                          expf(x.w - mx) * inv);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] = expf(z[i] - mx) * inv;
  }
  if (threadIdx.x == 0) losses[n] = logf(s) + mx - z_target;
}

__global__ void crossentropy_backward_k(float* dlogits, const float* probs, const int32_t* targets,
                                        float dloss, int N, int V, int v_begin) {
  const std::size_t total = static_cast<std::size_t>(N) * V;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t n = i / V;
    const int col = static_cast<int>(i % V);
    float d = probs[i] * dloss;
    if (targets[n] - v_begin == col) d -= dloss;
    dlogits[i] = d;
  }
}

// The same, a block per row and 4 columns per load (V a multiple of 4, rows 16-byte aligned):
// no division per element.
__global__ void crossentropy_backward4_k(float4* dlogits, const float4* probs,
                                         const int32_t* targets, float dloss, int V, int v_begin) {
  const std::size_t row = blockIdx.x;
  const int t = targets[row] - v_begin; // the target's column, maybe outside [0, V)
  const std::size_t at = row * (V / 4);
  for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
    const float4 p = probs[at + i];
    float4 d = make_float4(p.x * dloss, p.y * dloss, p.z * dloss, p.w * dloss);
    if (t / 4 == i && t >= 0) {
      if (t % 4 == 0) d.x -= dloss;
      if (t % 4 == 1) d.y -= dloss;
      if (t % 4 == 2) d.z -= dloss;
      if (t % 4 == 3) d.w -= dloss;
    }
    dlogits[at + i] = d;
  }
}

__global__ void row_max_k(float* mx, const float* x, int V) {
  __shared__ float shared[32];
  const std::size_t n = blockIdx.x;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, x[n * V + i]);
  m = block_reduce<true>(m, shared);
  if (threadIdx.x == 0) mx[n] = m;
}

__global__ void gather_target_k(float* z, const float* x, const int32_t* targets, int N, int V,
                                int v_begin) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int t = targets[n] - v_begin;
  z[n] = (t >= 0 && t < V) ? x[static_cast<std::size_t>(n) * V + t] : 0.0f;
}

__global__ void softmax_exp_k(float* p, float* sum, const float* x, const float* mx, int V) {
  __shared__ float shared[32];
  const std::size_t n = blockIdx.x;
  float s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float e = expf(x[n * V + i] - mx[n]);
    p[n * V + i] = e;
    s += e;
  }
  s = block_reduce<false>(s, shared);
  if (threadIdx.x == 0) sum[n] = s;
}

__global__ void crossentropy_finish_k(float* losses, float* p, const float* sum, const float* mx,
                                      const float* z_target, int V) {
  const std::size_t n = blockIdx.x;
  const float inv = 1.0f / sum[n];
  for (int i = threadIdx.x; i < V; i += blockDim.x) p[n * V + i] *= inv;
  if (threadIdx.x == 0) losses[n] = logf(sum[n]) + mx[n] - z_target[n];
}

// One AdamW step of one parameter (the host's order of operations, and torch.optim.AdamW's).
struct AdamW {
  float beta1, beta2, eps, decay, grad_scale, step_size, bc2_sqrt;
  __device__ void operator()(float& param, float& m, float& v, float grad) const {
    const float gr = grad * grad_scale;
    float p = param * decay;
    const float mi = m + (1.0f - beta1) * (gr - m);
    const float vi = beta2 * v + (1.0f - beta2) * gr * gr;
    p -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    param = p;
    m = mi;
    v = vi;
  }
};

__global__ void adamw_k(float* param, float* m, float* v, const float* grad, std::size_t n,
                        AdamW f) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    f(param[i], m[i], v[i], grad[i]);
  }
}

__global__ void adamw4_k(float4* param, float4* m, float4* v, const float4* grad, std::size_t n4,
                         AdamW f) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float4 p = param[i], mi = m[i], vi = v[i];
    const float4 gr = grad[i];
    f(p.x, mi.x, vi.x, gr.x);
    f(p.y, mi.y, vi.y, gr.y);
    f(p.z, mi.z, vi.z, gr.z);
    f(p.w, mi.w, vi.w, gr.w);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
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

// The attention products of one sequence, over its NH heads: fp32 (at g.compute) or bf16.
void gemm_heads(bool ta, bool tb, int M, int N, int K, float alpha, const void* A, int lda,
                long long sa, const void* B, int ldb, long long sb, float beta, void* C,
                cudaDataType_t ctype, int ldc, long long sc, int count, const char* what) {
  const cudaDataType_t in = g.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  gemm_typed(ta, tb, M, N, K, alpha, {A, in, lda}, sa, {B, in, ldb}, sb, beta, C, ctype, ldc, sc,
             count, g.bf16 ? CUBLAS_COMPUTE_32F : g.compute, what);
}

// The largest power of two (up to 256) that divides the address.
int alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  int k = 1;
  while (k < 256 && a % (2 * k) == 0) k *= 2;
  return k;
}

void destroy_plan(LtPlan& p) {
  if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d}) {
    if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
  }
  p = LtPlan{};
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

unsigned warp_rows_blocks(int N) {
  return static_cast<unsigned>(std::max(1, (N + kThreads / 32 - 1) / (kThreads / 32)));
}

dim3 column_grid(int N, int C) {
  return dim3(static_cast<unsigned>(std::max(1, (C + 31) / 32)),
              static_cast<unsigned>(std::max(1, std::min(N, kRowSlices))));
}

} // namespace

// ---- backend control ------------------------------------------------------------------------

void init(int device) {
  if (g.stream != nullptr) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  g.device = device;
  check(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cublasCreate(&g.blas), "cublasCreate");
  check(cublasSetStream(g.blas, g.stream), "cublasSetStream");
  check(cublasSetMathMode(g.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  check(cudaMalloc(&g.blas_workspace, kLtWorkspace), "cudaMalloc");
  check(cublasSetWorkspace(g.blas, g.blas_workspace, kLtWorkspace), "cublasSetWorkspace");
  check(cublasLtCreate(&g.lt), "cublasLtCreate");
  check(cudaMalloc(&g.lt_workspace, kLtWorkspace), "cudaMalloc");
}

void finalize() {
  if (g.stream == nullptr) return;
  cudaStreamSynchronize(g.stream);
  for (Scratch* x :
       {&g.dp, &g.op_a, &g.op_b, &g.qkv16, &g.dout16, &g.ds16, &g.lt_bias, &g.sums, &g.rowdot}) {
    free_scratch(*x);
  }
  cudaStreamSynchronize(g.stream);
  for (auto& [key, plan] : g.lt_plans) destroy_plan(plan);
  cudaFree(g.lt_workspace);
  cublasLtDestroy(g.lt);
  cublasDestroy(g.blas);
  cudaFree(g.blas_workspace);
  cudaStreamDestroy(g.stream);
  g = Backend{};
}

void synchronize() {
  ready();
  check(cudaStreamSynchronize(g.stream), "a queued kernel");
}

void set_tf32(bool on) {
  set_precision(on ? "tf32" : "fp32");
}

void set_precision(const std::string& precision) {
  ready();
  if (precision == "fp32") {
    g.compute = CUBLAS_COMPUTE_32F;
  } else if (precision == "tf32") {
    g.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  } else if (precision != "bf16") {
    throw std::runtime_error("CUDA backend: unknown precision \"" + precision + "\"");
  }
  g.bf16 = precision == "bf16";
}

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

void* stream() {
  return g.stream;
}

long flash_attention_calls() {
  return g.flash_calls;
}

long bias_epilogue_products() {
  return g.lt_products;
}

const char* blas_name() {
  return "cublas";
}

void* alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return p;
}

void release(void* p) {
  cudaFree(p);
}

void* alloc_managed(std::size_t bytes) {
  ready();
  void* p = nullptr;
  check(cudaMallocManaged(&p, bytes == 0 ? 1 : bytes, cudaMemAttachGlobal), "cudaMallocManaged");
  check(cudaMemsetAsync(p, 0, bytes == 0 ? 1 : bytes, g.stream), "cudaMemset");
  synchronize();
  return p;
}

void copy(void* dst, const void* src, std::size_t bytes) {
  ready();
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g.stream), "cudaMemcpyAsync");
}

void to_device(void* dst, const void* src, std::size_t bytes) {
  ready();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g.stream), "copy to device");
  synchronize();
}

void to_host(void* dst, const void* src, std::size_t bytes) {
  ready();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g.stream), "copy to host");
  synchronize();
}

// ---- ops ------------------------------------------------------------------------------------

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C, int v_begin, int v_end) {
  ready();
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  encoder_forward_k<<<blocks_for(n), kThreads, 0, g.stream>>>(out, tokens, wte, wpe, B * T, T, C,
                                                              v_begin, v_end);
  launched("encoder_forward");
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C, int v_begin, int v_end) {
  ready();
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  encoder_backward_k<<<blocks_for(n), kThreads, 0, g.stream>>>(dwte, dwpe, dout, tokens, B * T, T,
                                                               C, v_begin, v_end);
  launched("encoder_backward");
}

// Whether the layer norms of (N, C) rows at these pointers can read 4 floats at a time.
bool rows_by4(int N, int C, std::initializer_list<const void*> ps) {
  return C % 4 == 0 && by4(static_cast<std::size_t>(N) * C, ps);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C) {
  ready();
  if (N == 0) return;
  if (rows_by4(N, C, {out, inp, w, b})) {
    layernorm_forward_k<true>
        <<<warp_rows_blocks(N), kThreads, 0, g.stream>>>(out, mean, rstd, inp, w, b, N, C);
  } else {
    layernorm_forward_k<false>
        <<<warp_rows_blocks(N), kThreads, 0, g.stream>>>(out, mean, rstd, inp, w, b, N, C);
  }
  launched("layernorm_forward");
}

void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                              const float* mean, const float* rstd, int N, int C) {
  ready();
  if (N == 0) return;
  if (rows_by4(N, C, {dinp, dout, inp, w})) {
    layernorm_backward_input_k<true>
        <<<warp_rows_blocks(N), kThreads, 0, g.stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  } else {
    layernorm_backward_input_k<false>
        <<<warp_rows_blocks(N), kThreads, 0, g.stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  }
  launched("layernorm_backward_input");
}

void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C) {
  ready();
  if (N == 0) return;
  layernorm_backward_weight_k<<<column_grid(N, C), kThreads, 0, g.stream>>>(dw, db, dout, inp, mean,
                                                                            rstd, N, C);
  launched("layernorm_backward_weight");
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
    const std::size_t n = static_cast<std::size_t>(N) * OC;
    broadcast_rows_k<<<blocks_for(n), kThreads, 0, g.stream>>>(out, bias, N, OC);
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
    column_sum_k<<<column_grid(N, OC), kThreads, 0, g.stream>>>(dbias, dout, N, OC);
    launched("matmul_backward_weight bias");
  }
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  ready();
  if (B == 0 || T == 0) return;
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const long long TT = static_cast<long long>(T) * T;
  // bf16: q, k, v converted once; P stored in bf16 in the att buffer
  const std::size_t es = g.bf16 ? sizeof(bf16) : sizeof(float);
  const cudaDataType_t ptype = g.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  if (g.bf16 && flash::takes(B, T, C, NH)) { // att keeps row statistics (and qkv), not P
    bf16* qkv16 = flash::qkv_copy(att, B, T, C, NH);
    if (qkv16 == nullptr)
      qkv16 = grown<bf16>(g.qkv16, std::size_t(B) * T * C3, "attention_forward");
    to_bf16(qkv16, qkv, static_cast<std::size_t>(B) * T, C3, C3, "attention_forward");
    flash::forward(out, att, qkv16, B, T, C, NH, g.stream);
    ++g.flash_calls;
    return;
  }
  const char* in = reinterpret_cast<const char*>(qkv);
  if (g.bf16) {
    in = reinterpret_cast<const char*>(
        as_bf16(g.qkv16, qkv, static_cast<std::size_t>(B) * T, C3, C3, "attention_forward"));
  }
  for (int b = 0; b < B; ++b) { // all heads of one sequence per call
    const char* q = in + es * static_cast<std::size_t>(b) * T * C3;
    const char* k = q + es * C;
    const char* v = q + es * 2 * C;
    char* p = reinterpret_cast<char*>(att) + es * static_cast<std::size_t>(b) * NH * TT;
    gemm_heads(false, true, T, T, HS, scale, q, C3, HS, k, C3, HS, 0.0f, p, ptype, T, TT, NH,
               "attention scores");
    if (g.bf16) {
      causal_softmax_k<<<static_cast<unsigned>(NH * T), kThreads, 0, g.stream>>>(
          reinterpret_cast<bf16*>(p), T);
    } else {
      causal_softmax_k<<<static_cast<unsigned>(NH * T), kThreads, 0, g.stream>>>(
          reinterpret_cast<float*>(p), T);
    }
    launched("attention softmax");
    float* o = out + static_cast<std::size_t>(b) * T * C;
    gemm_heads(false, false, T, HS, T, 1.0f, p, T, TT, v, C3, HS, 0.0f, o, CUDA_R_32F, C, HS, NH,
               "attention output");
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  ready();
  if (B == 0 || T == 0) return;
  (void)scratch;
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const long long TT = static_cast<long long>(T) * T;
  const std::size_t es = g.bf16 ? sizeof(bf16) : sizeof(float);
  // dP, then dS in place over it: fp32, or bf16 (as cuBLAS writes it at precision bf16)
  if (g.bf16 && flash::takes(B, T, C, NH)) { // att holds what flash::forward kept (its qkv too)
    const bf16* dout16 =
        as_bf16(g.dout16, dout, static_cast<std::size_t>(B) * T, C, C, "attention_backward");
    const bf16* qkv16 = flash::qkv_copy(att, B, T, C, NH);
    if (qkv16 == nullptr) {
      qkv16 = as_bf16(g.qkv16, qkv, static_cast<std::size_t>(B) * T, C3, C3, "attention_backward");
    }
    float* rowdot =
        grown<float>(g.rowdot, static_cast<std::size_t>(B) * NH * T, "attention_backward row sums");
    flash::backward(dqkv, rowdot, dout, dout16, qkv16, att, B, T, C, NH, g.stream);
    ++g.flash_calls;
    return;
  }
  void* ds = nullptr;
  const char* in = reinterpret_cast<const char*>(qkv);
  const char* dy = reinterpret_cast<const char*>(dout);
  if (g.bf16) {
    ds = grown<bf16>(g.ds16, static_cast<std::size_t>(NH) * TT, "attention_backward scratch");
    in = reinterpret_cast<const char*>(
        as_bf16(g.qkv16, qkv, static_cast<std::size_t>(B) * T, C3, C3, "attention_backward"));
    dy = reinterpret_cast<const char*>(
        as_bf16(g.dout16, dout, static_cast<std::size_t>(B) * T, C, C, "attention_backward"));
  } else {
    ds = grown<float>(g.dp, static_cast<std::size_t>(NH) * TT, "attention_backward scratch");
  }
  const cudaDataType_t dstype = g.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  for (int b = 0; b < B; ++b) {
    const std::size_t off = static_cast<std::size_t>(b) * T * C3;
    const char* q = in + es * off;
    const char* k = q + es * C;
    const char* v = q + es * 2 * C;
    float* dq = dqkv + off;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const char* p = reinterpret_cast<const char*>(att) + es * static_cast<std::size_t>(b) * NH * TT;
    const char* d = dy + es * static_cast<std::size_t>(b) * T * C;
    // dP = dout_h @ v^T ; dv = P^T @ dout_h
    gemm_heads(false, true, T, T, HS, 1.0f, d, C, HS, v, C3, HS, 0.0f, ds, dstype, T, TT, NH,
               "attention dP");
    gemm_heads(true, false, T, HS, T, 1.0f, p, T, TT, d, C, HS, 0.0f, dv, CUDA_R_32F, C3, HS, NH,
               "attention dv");
    if (g.bf16) {
      causal_softmax_backward_k<<<static_cast<unsigned>(NH * T), kThreads, 0, g.stream>>>(
          static_cast<bf16*>(ds), reinterpret_cast<const bf16*>(p), T);
    } else {
      causal_softmax_backward_k<<<static_cast<unsigned>(NH * T), kThreads, 0, g.stream>>>(
          static_cast<float*>(ds), reinterpret_cast<const float*>(p), T);
    }
    launched("attention softmax backward");
    // dq = scale dS @ k ; dk = scale dS^T @ q
    gemm_heads(false, false, T, HS, T, scale, ds, T, TT, k, C3, HS, 0.0f, dq, CUDA_R_32F, C3, HS,
               NH, "attention dq");
    gemm_heads(true, false, T, HS, T, scale, ds, T, TT, q, C3, HS, 0.0f, dk, CUDA_R_32F, C3, HS, NH,
               "attention dk");
  }
}

template <class F>
void map(float* out, const float* a, const float* b, std::size_t n, F f, const char* what) {
  ready();
  if (by4(n, {out, a, b})) {
    map4_k<<<blocks_for(n / 4), kThreads, 0, g.stream>>>(
        reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(a),
        reinterpret_cast<const float4*>(b), n / 4, f);
  } else {
    map_k<<<blocks_for(n), kThreads, 0, g.stream>>>(out, a, b, n, f);
  }
  launched(what);
}

void gelu_forward(float* out, const float* inp, std::size_t n) {
  map(out, inp, nullptr, n, Gelu{}, "gelu_forward");
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) {
  map(dinp, inp, dout, n, GeluGrad{}, "gelu_backward");
}

void add(float* out, const float* a, const float* b, std::size_t n) {
  map(out, a, b, n, Axpby{1.0f, 1.0f}, "add");
}

void accumulate(float* acc, const float* x, std::size_t n) {
  map(acc, acc, x, n, Axpby{1.0f, 1.0f}, "accumulate");
}

void zero(float* x, std::size_t n) {
  ready();
  check(cudaMemsetAsync(x, 0, n * sizeof(float), g.stream), "zero");
}

void scale(float* x, float s, std::size_t n) {
  map(x, x, nullptr, n, Axpby{s, 0.0f}, "scale");
}

void sum_squares_each(double* out, const float* x, const std::size_t* offsets,
                      const std::size_t* sizes, int count) {
  ready();
  if (count <= 0) return;
  const auto n = static_cast<std::size_t>(count);
  double* d = grown<double>(g.sums, n, "sum_squares_each");
  check(cudaMemsetAsync(d, 0, n * sizeof(double), g.stream), "sum_squares_each");
  for (std::size_t i = 0; i < n; ++i) {
    sum_squares_k<<<std::min(blocks_for(sizes[i]), 1024u), kThreads, 0, g.stream>>>(
        d + i, x + offsets[i], sizes[i]);
  }
  launched("sum_squares_each");
  to_host(out, d, n * sizeof(double)); // the one wait
}

double sum_squares(const float* x, std::size_t n) {
  const std::size_t offset = 0;
  double total = 0.0;
  sum_squares_each(&total, x, &offset, &n, 1);
  return total;
}

void crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V) {
  ready();
  if (N == 0 || V == 0) return;
  const std::size_t n = static_cast<std::size_t>(N) * V;
  if (V % 4 == 0 && by4(n, {probs, logits})) {
    crossentropy_forward_k<true>
        <<<static_cast<unsigned>(N), 512, 0, g.stream>>>(losses, probs, logits, targets, V);
  } else {
    crossentropy_forward_k<false>
        <<<static_cast<unsigned>(N), 512, 0, g.stream>>>(losses, probs, logits, targets, V);
  }
  launched("crossentropy_forward");
}

void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                           int N, int V, int v_begin) {
  ready();
  const std::size_t n = static_cast<std::size_t>(N) * V;
  if (n == 0) return;
  if (V % 4 == 0 && by4(n, {dlogits, probs})) {
    crossentropy_backward4_k<<<static_cast<unsigned>(N), kThreads, 0, g.stream>>>(
        reinterpret_cast<float4*>(dlogits), reinterpret_cast<const float4*>(probs), targets, dloss,
        V, v_begin);
  } else {
    crossentropy_backward_k<<<blocks_for(n), kThreads, 0, g.stream>>>(dlogits, probs, targets,
                                                                      dloss, N, V, v_begin);
  }
  launched("crossentropy_backward");
}

void row_max(float* mx, const float* x, int N, int V) {
  ready();
  if (N == 0 || V == 0) return;
  row_max_k<<<static_cast<unsigned>(N), 512, 0, g.stream>>>(mx, x, V);
  launched("row_max");
}

void gather_target(float* z, const float* x, const int32_t* targets, int N, int V, int v_begin) {
  ready();
  if (N == 0) return;
  gather_target_k<<<blocks_for(static_cast<std::size_t>(N)), kThreads, 0, g.stream>>>(
      z, x, targets, N, V, v_begin);
  launched("gather_target");
}

void softmax_exp(float* p, float* sum, const float* x, const float* mx, int N, int V) {
  ready();
  if (N == 0 || V == 0) return;
  softmax_exp_k<<<static_cast<unsigned>(N), 512, 0, g.stream>>>(p, sum, x, mx, V);
  launched("softmax_exp");
}

void crossentropy_finish(float* losses, float* p, const float* sum, const float* mx,
                         const float* z_target, int N, int V) {
  ready();
  if (N == 0 || V == 0) return;
  crossentropy_finish_k<<<static_cast<unsigned>(N), 512, 0, g.stream>>>(losses, p, sum, mx,
                                                                        z_target, V);
  launched("crossentropy_finish");
}

void adamw_update(float* param, float* m, float* v, const float* grad, std::size_t n,
                  const pt::ops::AdamWStep& s) {
  ready();
  const AdamW f{s.beta1,
                s.beta2,
                s.eps,
                1.0f - s.lr * s.weight_decay,
                s.grad_scale,
                static_cast<float>(s.lr / (1.0 - s.beta1_t)),
                static_cast<float>(std::sqrt(1.0 - s.beta2_t))};
  if (by4(n, {param, m, v, grad})) {
    adamw4_k<<<blocks_for(n / 4), kThreads, 0, g.stream>>>(
        reinterpret_cast<float4*>(param), reinterpret_cast<float4*>(m),
        reinterpret_cast<float4*>(v), reinterpret_cast<const float4*>(grad), n / 4, f);
  } else {
    adamw_k<<<blocks_for(n), kThreads, 0, g.stream>>>(param, m, v, grad, n, f);
  }
  launched("adamw_update");
}

} // namespace pt::cuda_ops
