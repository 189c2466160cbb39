// The kernel API of pipetrain: every backend (kernels/host, kernels/cuda) implements these.
// Pointers live in the backend's memory space. Nothing here knows about MPI.
//
// Letters: B = batch (micro-batch), T = sequence, C = channels (d_model), V = vocab,
// NH = heads, HS = C / NH, N = rows = B*T, OC = output channels of a Linear.
// Linear weights are (OC, C) as in PyTorch's nn.Linear: out = inp @ w^T + bias.
// Every "backward" function ACCUMULATES into its gradient outputs (+=) unless it says "writes",
// so gradients of several micro-batches sum without extra passes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pt::ops {

// ---- backend control ------------------------------------------------------------------------
// Name of the BLAS this build calls ("openblas", "blis", ...).
const char* blas_name();
// Whether this build's Kokkos has a threaded host backend (OpenMP or Threads), and its name.
bool host_threads_available();
const char* host_space_name();
// The host threads of this rank, for the lifetime of the object (one per process): Kokkos' host
// execution space started with n threads (1 without a threaded backend) and the BLAS kept to one
// thread. Every op then gives the same bits at any n: loops write each output from one
// iteration, reductions combine fixed chunks in a fixed order, and products split their output
// into blocks fixed by the shape (never the inner dimension) that the threads take.
class HostThreads {
public:
  explicit HostThreads(int n);
  ~HostThreads();
  HostThreads(const HostThreads&) = delete;
  HostThreads& operator=(const HostThreads&) = delete;
};
// Threads of the running host execution space.
int host_threads();
// Floats of the host attention_backward's scratch: a (T,T) tile for each pair of (batch row,
// head) that runs at once, at most one per thread.
std::size_t attention_scratch_floats(int B, int T, int NH);

// ---- optimizer ------------------------------------------------------------------------------
// One AdamW step on n parameters (decoupled decay: p -= lr*wd*p before the Adam update).
// grad_scale multiplies g first (grad-norm clipping); beta1_t = beta1^t, beta2_t = beta2^t.
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  double beta1_t, beta2_t;
};
// A run of parameters adamw_update updates: param[param_offset, +size) with the moments and the
// gradient at [state_offset, +size); decay: the step's weight decay applies (else none).
struct AdamWSegment {
  std::size_t param_offset = 0, state_offset = 0, size = 0;
  bool decay = false;
};

#include "ops_list.inc" // the ops, declared once for every backend

} // namespace pt::ops
