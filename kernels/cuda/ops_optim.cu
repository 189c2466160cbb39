// The optimizer step (adamw_update), 4 parameters per load where n and the pointers allow.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "cuda/cuda_common.cuh"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda_ops {
using namespace detail;

namespace {

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

} // namespace

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
