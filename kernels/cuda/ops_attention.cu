// Causal self-attention (attention_forward, attention_backward) at precision bf16 by
// device.attention: cuDNN's fused attention (attention_cudnn.hpp), the flash kernels
// (flash_attention.hpp), or per sequence two batched cuBLAS products over its heads around a
// causal softmax kernel (always at fp32 and tf32); "auto": the first of these that takes the
// shape.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/attention_cudnn.hpp"
#include "cuda/attention_kept.hpp"
#include "cuda/cuda_common.cuh"
#include "cuda/flash_attention.hpp"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda_ops {
using namespace detail;

namespace {

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

enum class Path { gemm, flash, cudnn };

// The kernels attention runs for this shape (device.attention, set_attention). "auto": cuDNN's
// where it has graphs for the shape (measured fastest on an H200, docs/performance.md), else the
// flash kernels where they take it, else cuBLAS.
Path path(int B, int T, int C, int NH) {
  if (!g.bf16) return Path::gemm;
  const bool flash_takes = flash::takes(B, T, C, NH);
  switch (g.attention) {
  case AttentionPath::cudnn:
    if (!cudnn_attention::supports(B, T, C, NH, g.stream)) {
      throw std::runtime_error("device.attention = \"cudnn\": cuDNN has no fused attention for "
                               "head size " +
                               std::to_string(C / NH) + " and " + std::to_string(T) +
                               " tokens on this GPU; use \"auto\"");
    }
    return Path::cudnn;
  case AttentionPath::flash:
    if (!flash_takes) {
      throw std::runtime_error("device.attention = \"flash\": the flash kernels take head sizes "
                               "32 and 64 on a GPU of compute capability 8.0 or later, not head "
                               "size " +
                               std::to_string(C / NH) + " here; use \"auto\"");
    }
    return Path::flash;
  case AttentionPath::gemm:
    return Path::gemm;
  case AttentionPath::automatic:
    break;
  }
  if (cudnn_attention::supports(B, T, C, NH, g.stream)) return Path::cudnn;
  return flash_takes ? Path::flash : Path::gemm;
}

template <class E> E* at_byte(float* att, std::size_t offset) {
  return reinterpret_cast<E*>(reinterpret_cast<char*>(att) + offset);
}
template <class E> const E* at_byte(const float* att, std::size_t offset) {
  return reinterpret_cast<const E*>(reinterpret_cast<const char*>(att) + offset);
}

void cudnn_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const CudnnKept k(B, T, C, NH);
  const std::size_t rows = static_cast<std::size_t>(B) * T;
  bf16* qkv16 = at_byte<bf16>(att, k.qkv16);
  to_bf16(qkv16, qkv, rows, 3 * C, 3 * C, "attention_forward");
  bf16* o16 = at_byte<bf16>(att, k.o16);
  cudnn_attention::forward(o16, at_byte<float>(att, k.stats), qkv16, B, T, C, NH, g.stream);
  unpack_bf16(out, reinterpret_cast<const std::uint16_t*>(o16), rows * C); // exact
}

void cudnn_backward(float* dqkv, const float* dout, const float* att, int B, int T, int C, int NH) {
  const CudnnKept k(B, T, C, NH);
  const std::size_t rows = static_cast<std::size_t>(B) * T;
  const bf16* dout16 = as_bf16(g.dout16, dout, rows, C, C, "attention_backward");
  bf16* d16 = grown<bf16>(g.dqkv16, rows * 3 * C, "attention_backward dqkv");
  cudnn_attention::backward(d16, at_byte<bf16>(att, k.qkv16), at_byte<bf16>(att, k.o16), dout16,
                            at_byte<float>(att, k.stats), B, T, C, NH, g.stream);
  unpack_bf16(dqkv, reinterpret_cast<const std::uint16_t*>(d16), rows * 3 * C);
}

} // namespace

std::size_t attention_floats(int B, int T, int C, int NH) {
  ready();
  const auto floats = [](std::size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); };
  const std::size_t probs = static_cast<std::size_t>(B) * NH * T * T;
  switch (path(B, T, C, NH)) {
  case Path::cudnn:
    return floats(CudnnKept(B, T, C, NH).end);
  case Path::flash:
    return floats(flash::kept_bytes(B, T, C, NH));
  case Path::gemm:
    break;
  }
  return g.bf16 ? (probs + 1) / 2 : probs; // bf16: P kept in bf16, two to a float
}

bool attention_keeps_qkv(int B, int T, int C, int NH) {
  ready();
  switch (path(B, T, C, NH)) {
  case Path::cudnn:
    return true;
  case Path::flash:
    return flash::keeps_qkv(B, T, C, NH);
  case Path::gemm:
    break;
  }
  return false;
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
  const Path route = path(B, T, C, NH);
  if (route == Path::cudnn) return cudnn_forward(out, att, qkv, B, T, C, NH);
  if (route == Path::flash) { // att keeps row statistics (and qkv), not P
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
  const Path route = path(B, T, C, NH);
  if (route == Path::cudnn) return cudnn_backward(dqkv, dout, att, B, T, C, NH);
  if (route == Path::flash) { // att holds what flash::forward kept (its qkv too)
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

} // namespace pt::cuda_ops
