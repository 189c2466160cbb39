// The optimizer step (adamw_update): one launch over every segment, a block per chunk of one.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <vector>

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

// One block per chunk: the chunk's values of one segment, with that segment's decay.
__global__ void adamw_k(float* param, float* m, float* v, const float* grad, const Chunk* chunks,
                        AdamW f, float decay) {
  const Chunk c = chunks[blockIdx.x];
  f.decay = c.flag != 0 ? decay : 1.0f;
  for (unsigned i = threadIdx.x; i < c.len; i += blockDim.x) {
    f(param[c.a + i], m[c.b + i], v[c.b + i], grad[c.b + i]);
  }
}

} // namespace

void adamw_update(float* param, float* m, float* v, const float* grad, const AdamWSegment* segments,
                  int count, const pt::ops::AdamWStep& s) {
  ready();
  std::vector<Chunk> chunks;
  for (int k = 0; k < count; ++k) {
    const AdamWSegment& x = segments[k];
    add_chunks(chunks, x.param_offset, x.state_offset, x.size, static_cast<unsigned>(k),
               x.decay ? 1 : 0);
  }
  if (chunks.empty()) return;
  // a segment without decay multiplies by 1 - lr * 0 = 1: the host's and the per-tensor value
  const AdamW f{s.beta1,
                s.beta2,
                s.eps,
                1.0f,
                s.grad_scale,
                static_cast<float>(s.lr / (1.0 - s.beta1_t)),
                static_cast<float>(std::sqrt(1.0 - s.beta2_t))};
  const Chunk* d = device_chunks(g.adam_chunks, chunks, "adamw_update");
  adamw_k<<<static_cast<unsigned>(chunks.size()), kThreads, 0, g.stream>>>(
      param, m, v, grad, d, f, 1.0f - s.lr * s.weight_decay);
  launched("adamw_update");
}

} // namespace pt::cuda_ops
