// Elementwise ops and the embedding: encoder_forward/backward, GELU, add, accumulate, zero,
// scale, and the sums of squares (sum_squares, sum_squares_each).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda_ops {
using namespace detail;

namespace {

constexpr float kGeluScale = 0.7978845608028654f; // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

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

bool aligned8(std::initializer_list<const void*> ps) { // packed bf16: 4 values in 8 bytes
  for (const void* p : ps) {
    if (reinterpret_cast<std::uintptr_t>(p) % 8 != 0) return false;
  }
  return true;
}

// ---- elementwise maps: out[i] = f(a[i], b[i]) (b absent: f(a[i], 0)), 4 floats at a time where
// n and every pointer allow it (one 16-byte load per operand: fewer instructions in flight per
// byte, which is what these memory-bound loops wait on)

struct Gelu { // tanh approximation, as the host and GPT-2; bf16: the input rounded first
  bool bf16;
  __device__ float operator()(float x, float) const {
    if (bf16) x = bf16_value(x);
    const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    return 0.5f * x * (1.0f + t);
  }
};

struct GeluGrad { // d gelu(x) / dx times the incoming gradient d; bf16: both rounded first
  bool bf16;
  __device__ float operator()(float x, float d) const {
    if (bf16) {
      x = bf16_value(x);
      d = bf16_value(d);
    }
    const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    return d * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
};

struct Axpby { // add: 1, 1; accumulate: out = x = acc; scale: b = 0, no y
  float a, b;
  __device__ float operator()(float x, float y) const { return a * x + b * y; }
};

struct RoundBf16 { // to the nearest bfloat16, ties to even, kept in a float
  __device__ float operator()(float x, float) const { return bf16_value(x); }
};

struct ResidualAdd { // the branch (rounded first at bf16) plus the residual
  bool bf16;
  __device__ float operator()(float branch, float x) const {
    return (bf16 ? bf16_value(branch) : branch) + x;
  }
};

__device__ float widened(std::uint16_t h) {
  return __bfloat162float(__ushort_as_bfloat16(h));
}

__global__ void unpack_bf16_k(float* out, const std::uint16_t* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = widened(x[i]);
  }
}

// 4 values a thread: one 8-byte load, one 16-byte store
__global__ void unpack_bf16_4k(float4* out, const ushort4* x, std::size_t n4) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const ushort4 v = x[i];
    out[i] = make_float4(widened(v.x), widened(v.y), widened(v.z), widened(v.w));
  }
}

// GELU of x = bf16(inp): inp16 keeps x, out16 bf16(gelu(x)), 4 values a thread where aligned
__device__ void gelu_packed(std::uint16_t& out16, std::uint16_t& inp16, float x) {
  const bf16 h = __float2bfloat16_rn(x);
  inp16 = __bfloat16_as_ushort(h);
  out16 = __bfloat16_as_ushort(__float2bfloat16_rn(Gelu{false}(__bfloat162float(h), 0.0f)));
}

__global__ void gelu_forward_packed_k(std::uint16_t* out16, std::uint16_t* inp16, const float* inp,
                                      std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    gelu_packed(out16[i], inp16[i], inp[i]);
  }
}

__global__ void gelu_forward_packed4_k(ushort4* out16, ushort4* inp16, const float4* inp,
                                       std::size_t n4) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float4 x = inp[i];
    ushort4 o, h;
    gelu_packed(o.x, h.x, x.x);
    gelu_packed(o.y, h.y, x.y);
    gelu_packed(o.z, h.z, x.z);
    gelu_packed(o.w, h.w, x.w);
    out16[i] = o;
    inp16[i] = h;
  }
}

__global__ void gelu_backward_packed_k(float* dinp, const std::uint16_t* inp16, const float* dout,
                                       std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dinp[i] = GeluGrad{true}(widened(inp16[i]), dout[i]);
  }
}

__global__ void gelu_backward_packed4_k(float4* dinp, const ushort4* inp16, const float4* dout,
                                        std::size_t n4) {
  const GeluGrad f{true};
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const ushort4 h = inp16[i];
    const float4 d = dout[i];
    dinp[i] = make_float4(f(widened(h.x), d.x), f(widened(h.y), d.y), f(widened(h.z), d.z),
                          f(widened(h.w), d.w));
  }
}

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

// One block per chunk; sums[chunk] = its sum of squares (the host adds them up, in order).
__global__ void sum_squares_k(double* sums, const float* x, const Chunk* chunks) {
  __shared__ float shared[32];
  const Chunk c = chunks[blockIdx.x];
  float s = 0.0f; // per thread in float, blocks summed in double (as the host's chunks)
  for (unsigned i = threadIdx.x; i < c.len; i += blockDim.x) {
    const float y = x[c.a + i];
    s += y * y;
  }
  s = block_reduce<false>(s, shared);
  if (threadIdx.x == 0) sums[blockIdx.x] = static_cast<double>(s);
}

} // namespace

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

void gelu_forward(float* out, const float* inp, std::size_t n, bool bf16_in) {
  map(out, inp, nullptr, n, Gelu{bf16_in}, "gelu_forward");
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n, bool bf16_in) {
  map(dinp, inp, dout, n, GeluGrad{bf16_in}, "gelu_backward");
}

void residual_add(float* branch, const float* x, std::size_t n, bool bf16_branch) {
  map(branch, branch, x, n, ResidualAdd{bf16_branch}, "residual_add");
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

void gelu_forward_packed(std::uint16_t* out16, std::uint16_t* inp16, const float* inp,
                         std::size_t n) {
  ready();
  if (n == 0) return;
  if (by4(n, {inp}) && aligned8({out16, inp16})) {
    gelu_forward_packed4_k<<<blocks_for(n / 4), kThreads, 0, g.stream>>>(
        reinterpret_cast<ushort4*>(out16), reinterpret_cast<ushort4*>(inp16),
        reinterpret_cast<const float4*>(inp), n / 4);
  } else {
    gelu_forward_packed_k<<<blocks_for(n), kThreads, 0, g.stream>>>(out16, inp16, inp, n);
  }
  launched("gelu_forward_packed");
}

void gelu_backward_packed(float* dinp, const std::uint16_t* inp16, const float* dout,
                          std::size_t n) {
  ready();
  if (n == 0) return;
  if (by4(n, {dinp, dout}) && aligned8({inp16})) {
    gelu_backward_packed4_k<<<blocks_for(n / 4), kThreads, 0, g.stream>>>(
        reinterpret_cast<float4*>(dinp), reinterpret_cast<const ushort4*>(inp16),
        reinterpret_cast<const float4*>(dout), n / 4);
  } else {
    gelu_backward_packed_k<<<blocks_for(n), kThreads, 0, g.stream>>>(dinp, inp16, dout, n);
  }
  launched("gelu_backward_packed");
}

void round_bf16(float* x, std::size_t n) {
  map(x, x, nullptr, n, RoundBf16{}, "round_bf16");
}

void pack_bf16(std::uint16_t* out, const float* x, std::size_t n) {
  ready();
  if (n == 0) return;
  to_bf16(reinterpret_cast<bf16*>(out), x, n, 1, 1, "pack_bf16"); // 4 at a time where aligned
}

void unpack_bf16(float* out, const std::uint16_t* x, std::size_t n) {
  ready();
  if (n == 0) return;
  if (by4(n, {out}) && aligned8({x})) {
    unpack_bf16_4k<<<blocks_for(n / 4), kThreads, 0, g.stream>>>(
        reinterpret_cast<float4*>(out), reinterpret_cast<const ushort4*>(x), n / 4);
  } else {
    unpack_bf16_k<<<blocks_for(n), kThreads, 0, g.stream>>>(out, x, n);
  }
  launched("unpack_bf16");
}

void sum_squares_each(double* out, const float* x, const std::size_t* offsets,
                      const std::size_t* sizes, int count) {
  ready();
  if (count <= 0) return;
  const auto n = static_cast<std::size_t>(count);
  std::vector<Chunk> chunks;
  for (std::size_t i = 0; i < n; ++i) {
    add_chunks(chunks, offsets[i], 0, sizes[i], static_cast<unsigned>(i), 0);
  }
  std::fill(out, out + n, 0.0);
  if (chunks.empty()) return;
  double* d = grown<double>(g.sums, chunks.size(), "sum_squares_each");
  const Chunk* c = device_chunks(g.norm_chunks, chunks, "sum_squares_each");
  sum_squares_k<<<static_cast<unsigned>(chunks.size()), kThreads, 0, g.stream>>>(d, x, c);
  launched("sum_squares_each");
  std::vector<double> sums(chunks.size());
  to_host(sums.data(), d, sums.size() * sizeof(double)); // the one wait
  // each segment's chunks in order: the same bits on every run (no atomics)
  for (std::size_t i = 0; i < chunks.size(); ++i) out[chunks[i].seg] += sums[i];
}

double sum_squares(const float* x, std::size_t n) {
  const std::size_t offset = 0;
  double total = 0.0;
  sum_squares_each(&total, x, &offset, &n, 1);
  return total;
}

} // namespace pt::cuda_ops
