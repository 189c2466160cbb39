// The llama block's elementwise kernels (kernels/ops_list.inc): rotary position embedding,
// grouped-query attention's key/value heads and SwiGLU. RMSNorm is with the layer norm
// (ops_norm.cu). N = rows, F = MLP width, HD = head dim.
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/cuda_common.cuh"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda_ops {
using namespace detail;

namespace {

// one thread per (row, head, pair i < HD/2); the angle pos * theta^(-2i/HD) in double, as the
// host's table, so both backends turn by the same float cos and sin
__global__ void rope_k(float* x, int N, int T, int stride, int heads, int HD, float theta,
                       float sign) {
  const int half = HD / 2;
  const std::size_t total = static_cast<std::size_t>(N) * heads * half;
  for (std::size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < total;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(k % half);
    const std::size_t nh = k / half;
    const int h = static_cast<int>(nh % heads);
    const std::size_t n = nh / heads;
    const double a = static_cast<double>(n % T) * pow(static_cast<double>(theta), -2.0 * i / HD);
    const float co = static_cast<float>(cos(a)), si = sign * static_cast<float>(sin(a));
    float* v = x + n * stride + static_cast<std::size_t>(h) * HD;
    const float p = v[i], q = v[i + half];
    v[i] = p * co - q * si;
    v[i + half] = q * co + p * si;
  }
}

__device__ float read(const float* p, std::size_t i, bool bf16) { // bf16: rounded, ties to even
  return bf16 ? bf16_value(p[i]) : p[i];
}

__global__ void swiglu_forward_k(float* out, const float* inp, int N, int F, bool bf16) {
  const std::size_t total = static_cast<std::size_t>(N) * F;
  for (std::size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < total;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t n = k / F, j = k % F;
    const float gate = read(inp, n * 2 * F + j, bf16), up = read(inp, n * 2 * F + F + j, bf16);
    out[k] = gate * (1.0f / (1.0f + expf(-gate))) * up;
  }
}

__global__ void swiglu_backward_k(float* dinp, const float* inp, const float* dout, int N, int F,
                                  bool bf16) {
  const std::size_t total = static_cast<std::size_t>(N) * F;
  for (std::size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < total;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t n = k / F, j = k % F;
    const float gate = read(inp, n * 2 * F + j, bf16), up = read(inp, n * 2 * F + F + j, bf16),
                d = read(dout, k, bf16);
    const float s = 1.0f / (1.0f + expf(-gate));
    dinp[n * 2 * F + j] = d * up * s * (1.0f + gate * (1.0f - s));
    dinp[n * 2 * F + F + j] = d * gate * s;
  }
}

// one thread per value of the full rows: where it comes from in the packed rows
__global__ void kv_expand_k(float* full, const float* packed, int N, int NH, int NKV, int HD) {
  const int group = NH / NKV, in_row = (NH + 2 * NKV) * HD, out_row = 3 * NH * HD;
  const std::size_t total = static_cast<std::size_t>(N) * out_row;
  for (std::size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < total;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t n = k / out_row;
    const int c = static_cast<int>(k % out_row), part = c / (NH * HD), h = c % (NH * HD) / HD;
    const int from = part == 0 ? c : NH * HD + ((part - 1) * NKV + h / group) * HD + c % HD;
    full[k] = packed[n * in_row + from];
  }
}

// one thread per value of the packed rows: the sum of its copies, in order
__global__ void kv_reduce_k(float* packed, const float* full, int N, int NH, int NKV, int HD) {
  const int group = NH / NKV, out_row = (NH + 2 * NKV) * HD, in_row = 3 * NH * HD;
  const std::size_t total = static_cast<std::size_t>(N) * out_row;
  for (std::size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < total;
       k += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t n = k / out_row;
    const int c = static_cast<int>(k % out_row);
    const float* src = full + n * in_row;
    if (c < NH * HD) {
      packed[k] = src[c];
      continue;
    }
    const int kv = (c - NH * HD) / HD, part = 1 + kv / NKV, head = kv % NKV, i = c % HD;
    float sum = 0.0f;
    for (int j = 0; j < group; ++j) sum += src[(part * NH + head * group + j) * HD + i];
    packed[k] = sum;
  }
}

void rope(float* x, int N, int T, int stride, int heads, int HD, float theta, float sign,
          const char* what) {
  ready();
  const std::size_t n = static_cast<std::size_t>(N) * heads * (HD / 2);
  if (n == 0) return;
  rope_k<<<blocks_for(n), kThreads, 0, g.stream>>>(x, N, T, stride, heads, HD, theta, sign);
  launched(what);
}

} // namespace

void rope_forward(float* x, int N, int T, int stride, int heads, int HD, float theta) {
  rope(x, N, T, stride, heads, HD, theta, 1.0f, "rope_forward");
}

void rope_backward(float* x, int N, int T, int stride, int heads, int HD, float theta) {
  rope(x, N, T, stride, heads, HD, theta, -1.0f, "rope_backward");
}

void kv_expand(float* full, const float* packed, int N, int NH, int NKV, int HD) {
  ready();
  const std::size_t n = static_cast<std::size_t>(N) * 3 * NH * HD;
  if (n == 0) return;
  kv_expand_k<<<blocks_for(n), kThreads, 0, g.stream>>>(full, packed, N, NH, NKV, HD);
  launched("kv_expand");
}

void kv_reduce(float* packed, const float* full, int N, int NH, int NKV, int HD) {
  ready();
  const std::size_t n = static_cast<std::size_t>(N) * (NH + 2 * NKV) * HD;
  if (n == 0) return;
  kv_reduce_k<<<blocks_for(n), kThreads, 0, g.stream>>>(packed, full, N, NH, NKV, HD);
  launched("kv_reduce");
}

void swiglu_forward(float* out, const float* inp, int N, int F, bool bf16_in) {
  ready();
  const std::size_t n = static_cast<std::size_t>(N) * F;
  if (n == 0) return;
  swiglu_forward_k<<<blocks_for(n), kThreads, 0, g.stream>>>(out, inp, N, F, bf16_in);
  launched("swiglu_forward");
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F, bool bf16_in) {
  ready();
  const std::size_t n = static_cast<std::size_t>(N) * F;
  if (n == 0) return;
  swiglu_backward_k<<<blocks_for(n), kThreads, 0, g.stream>>>(dinp, inp, dout, N, F, bf16_in);
  launched("swiglu_backward");
}

} // namespace pt::cuda_ops
