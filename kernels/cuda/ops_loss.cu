// Softmax and cross-entropy over the vocabulary: crossentropy_forward/backward, and the pieces
// of its vocabulary-parallel form (row_max, gather_target, softmax_exp, crossentropy_finish).
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cuda/cuda_common.cuh"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda_ops {
using namespace detail;

namespace {

// One block per row: softmax of the logits, and the loss in log-sum-exp form. The logits are
// read twice: once for the maximum and the sum together (each thread keeps a running maximum
// and rescales its sum when it grows), once to write the probabilities, or (Grad) the
// gradient (p - onehot) * dloss with crossentropy_backward's arithmetic. Vec: 4 logits per
// load (V a multiple of 4, rows 16-byte aligned).
template <bool Vec, bool Grad>
__global__ void crossentropy_forward_k(float* losses, float* probs, const float* logits,
                                       const int32_t* targets, int V, float dloss, bool bf16) {
  __shared__ float shared[32];
  const std::size_t n = blockIdx.x;
  const float* z = logits + n * V;
  float* p = probs + n * V;
  // bf16: each logit rounded to bfloat16 as it is read (the activation format's round)
  const auto r = [bf16](float x) { return bf16 ? bf16_value(x) : x; };
  const auto r4 = [&](float4 x) { return make_float4(r(x.x), r(x.y), r(x.z), r(x.w)); };
  const float z_target = r(z[targets[n]]); // read before p may overwrite z
  float m = -INFINITY, s = 0.0f;
  auto add = [&](float x) { // x <= m
    s += expf(x - m);
  };
  if constexpr (Vec) {
    const float4* z4 = reinterpret_cast<const float4*>(z);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 x = r4(z4[i]);
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
      const float x = r(z[i]);
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
  const int t = targets[n];
  // a probability, or its gradient (crossentropy_backward_k's two steps)
  auto out = [&](float x, int col) {
    const float q = expf(x - mx) * inv;
    if constexpr (!Grad) return q;
    float d = q * dloss;
    if (col == t) d -= dloss;
    return d;
  };
  if constexpr (Vec) {
    const float4* z4 = reinterpret_cast<const float4*>(z);
    float4* p4 = reinterpret_cast<float4*>(p);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 x = r4(z4[i]);
      p4[i] = make_float4(out(x.x, 4 * i), out(x.y, 4 * i + 1), out(x.z, 4 * i + 2),
                          out(x.w, 4 * i + 3));
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] = out(r(z[i]), i);
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

} // namespace

namespace {

template <bool Grad>
void crossentropy_rows(float* losses, float* out, const float* logits, const int32_t* targets,
                       float dloss, int N, int V, bool bf16, const char* what) {
  ready();
  if (N == 0 || V == 0) return;
  const std::size_t n = static_cast<std::size_t>(N) * V;
  if (V % 4 == 0 && by4(n, {out, logits})) {
    crossentropy_forward_k<true, Grad><<<static_cast<unsigned>(N), 512, 0, g.stream>>>(
        losses, out, logits, targets, V, dloss, bf16);
  } else {
    crossentropy_forward_k<false, Grad><<<static_cast<unsigned>(N), 512, 0, g.stream>>>(
        losses, out, logits, targets, V, dloss, bf16);
  }
  launched(what);
}

} // namespace

void crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V, bool bf16_in) {
  crossentropy_rows<false>(losses, probs, logits, targets, 0.0f, N, V, bf16_in,
                           "crossentropy_forward");
}

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float dloss, int N, int V,
                                   bool bf16_in) {
  crossentropy_rows<true>(losses, dlogits, logits, targets, dloss, N, V, bf16_in,
                          "crossentropy_forward_backward");
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

} // namespace pt::cuda_ops
