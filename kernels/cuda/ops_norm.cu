// Layer norm (layernorm_forward, layernorm_backward_input, layernorm_backward_weight) and RMSNorm
// (rmsnorm_*): a warp per row, the weight gradients as column sums over rows. The column sum and
// the bias broadcast of a Linear (ops_gemm.cu) are here too: the column-sum kernels share one
// device routine.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>

#include "cuda/cuda_common.cuh"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda_ops {
using namespace detail;

namespace {

constexpr float kLayerNormEps = 1e-5f;

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

// Column sums over rows: block (x: 32 columns, y: a slice of the rows) writes its slice's sums
// to slices[y * C + c]; add_slices then adds the slices in their order, so the sums have the same
// bits on every run (no atomics). f(row, col) is the term.
constexpr int kRowSlices = 64;
template <class F> __device__ void column_sums(float* slices, int N, int C, const F& f) {
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
    slices[static_cast<std::size_t>(blockIdx.y) * C + c] = t;
  }
}

// acc[c] += the count slices' sums of column c, in slice order
__global__ void add_slices_k(float* acc, const float* slices, int count, int C) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  float s = 0.0f;
  for (int y = 0; y < count; ++y) s += slices[static_cast<std::size_t>(y) * C + c];
  acc[c] += s;
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

// dw's slices at slices, db's after them
__global__ void layernorm_backward_weight_k(float* slices, const float* dout, const float* inp,
                                            const float* mean, const float* rstd, int N, int C) {
  column_sums(slices, N, C, NormTimesGrad{dout, inp, mean, rstd, C});
  column_sums(slices + static_cast<std::size_t>(gridDim.y) * C, N, C, Element{dout, C});
}

// RMSNorm: one warp per row, as the layer norm
__global__ void rmsnorm_forward_k(float* out, float* rstd, const float* inp, const float* w,
                                  float eps, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<std::size_t>(row) * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
  const float r = rsqrtf(warp_sum(ss) / C + eps);
  float* o = out + static_cast<std::size_t>(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = x[c] * r * w[c];
  if (lane == 0) rstd[row] = r;
}

__global__ void rmsnorm_backward_input_k(float* dinp, const float* dout, const float* inp,
                                         const float* w, const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const float *x = inp + off, *d = dout + off;
  const float r = rstd[row];
  float gx = 0.0f;
  for (int c = lane; c < C; c += 32) gx += d[c] * w[c] * x[c];
  const float k = r * r * warp_sum(gx) / C;
  float* dx = dinp + off;
  for (int c = lane; c < C; c += 32) dx[c] += (d[c] * w[c] - x[c] * k) * r;
}

struct RmsTimesGrad { // dout[r, c] * inp[r, c] * rstd[r]
  const float *dout, *inp, *rstd;
  int C;
  __device__ float operator()(int r, int c) const {
    const std::size_t i = static_cast<std::size_t>(r) * C + c;
    return dout[i] * inp[i] * rstd[r];
  }
};

__global__ void rmsnorm_backward_weight_k(float* slices, const float* dout, const float* inp,
                                          const float* rstd, int N, int C) {
  column_sums(slices, N, C, RmsTimesGrad{dout, inp, rstd, C});
}

__global__ void column_sum_k(float* slices, const float* x, int N, int C) {
  column_sums(slices, N, C, Element{x, C});
}

__global__ void broadcast_rows_k(float* out, const float* bias, int N, int OC) {
  const std::size_t total = static_cast<std::size_t>(N) * OC;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = bias[i % OC];
  }
}

unsigned warp_rows_blocks(int N) {
  return static_cast<unsigned>(std::max(1, (N + kThreads / 32 - 1) / (kThreads / 32)));
}

dim3 column_grid(int N, int C) {
  return dim3(static_cast<unsigned>(std::max(1, (C + 31) / 32)),
              static_cast<unsigned>(std::max(1, std::min(N, kRowSlices))));
}

// Room for `sums` column-sum kernels' slices over a grid (device scratch, stream order).
float* slices_for(const dim3& grid, int C, int sums, const char* what) {
  return grown<float>(g.colsum, static_cast<std::size_t>(sums) * grid.y * C, what);
}

void add_slices(float* acc, const float* slices, const dim3& grid, int C) {
  add_slices_k<<<static_cast<unsigned>((C + kThreads - 1) / kThreads), kThreads, 0, g.stream>>>(
      acc, slices, static_cast<int>(grid.y), C);
}

} // namespace

namespace detail {

void column_sum(float* acc, const float* x, int N, int C) {
  const dim3 grid = column_grid(N, C);
  float* slices = slices_for(grid, C, 1, "column_sum");
  column_sum_k<<<grid, kThreads, 0, g.stream>>>(slices, x, N, C);
  add_slices(acc, slices, grid, C);
}

void broadcast_rows(float* out, const float* bias, int N, int OC) {
  const std::size_t n = static_cast<std::size_t>(N) * OC;
  broadcast_rows_k<<<blocks_for(n), kThreads, 0, g.stream>>>(out, bias, N, OC);
}

} // namespace detail

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
  const dim3 grid = column_grid(N, C);
  float* slices = slices_for(grid, C, 2, "layernorm_backward_weight");
  layernorm_backward_weight_k<<<grid, kThreads, 0, g.stream>>>(slices, dout, inp, mean, rstd, N, C);
  add_slices(dw, slices, grid, C);
  add_slices(db, slices + static_cast<std::size_t>(grid.y) * C, grid, C);
  launched("layernorm_backward_weight");
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, float eps, int N,
                     int C) {
  ready();
  if (N == 0) return;
  rmsnorm_forward_k<<<warp_rows_blocks(N), kThreads, 0, g.stream>>>(out, rstd, inp, w, eps, N, C);
  launched("rmsnorm_forward");
}

void rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                            const float* rstd, int N, int C) {
  ready();
  if (N == 0) return;
  rmsnorm_backward_input_k<<<warp_rows_blocks(N), kThreads, 0, g.stream>>>(dinp, dout, inp, w, rstd,
                                                                           N, C);
  launched("rmsnorm_backward_input");
}

void rmsnorm_backward_weight(float* dw, const float* dout, const float* inp, const float* rstd,
                             int N, int C) {
  ready();
  if (N == 0) return;
  const dim3 grid = column_grid(N, C);
  float* slices = slices_for(grid, C, 1, "rmsnorm_backward_weight");
  rmsnorm_backward_weight_k<<<grid, kThreads, 0, g.stream>>>(slices, dout, inp, rstd, N, C);
  add_slices(dw, slices, grid, C);
  launched("rmsnorm_backward_weight");
}

} // namespace pt::cuda_ops
