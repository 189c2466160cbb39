// The CUDA backend of kernels/ops.hpp: the same functions, with the same shapes and the same
// "accumulates unless it says writes" rule, on device pointers. Every call is queued on one
// stream of the device chosen by init() and returns without waiting, except sum_squares (it
// returns a number) and synchronize(). Matrix products go through cuBLAS in fp32 (tensor-core
// TF32 only when set_tf32(true)). Errors throw std::runtime_error naming the call.
//
// Differences from the host backend, all within the parity tolerances (docs/cuda.md):
// - sums of many terms (column sums, gradient scatters) run in parallel with atomics, so their
//   order, and the last bits, change from run to run;
// - attention_backward ignores its scratch argument and uses device scratch of its own (it
//   works on all heads of a sequence at once: NH*T*T floats);
// - exp, log and tanh are CUDA's single-precision functions, not the host's fast_math ones.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops.hpp"

namespace pt::cuda_ops {

// ---- backend control ------------------------------------------------------------------------
// Selects the device, creates the stream and the cuBLAS handle (once per process).
void init(int device);
// Releases the stream, the handle and the scratch (before the process ends, if at all).
void finalize();
// Waits for everything queued; throws if a kernel failed.
void synchronize();
// fp32 matrix products on tensor cores with TF32 inputs (faster, about 1e-3 relative).
void set_tf32(bool on);
// The cudaStream_t every call uses (as void*, so that callers need no CUDA headers).
void* stream();
const char* blas_name(); // "cublas"

// ---- the ops of kernels/ops.hpp on device memory ---------------------------------------------
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C, int v_begin = 0, int v_end = 1 << 30);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C, int v_begin = 0, int v_end = 1 << 30);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C);
void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                              const float* mean, const float* rstd, int N, int C);
void layernorm_backward_weight(float* dw, float* db, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C);
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                    int OC);
void matmul_backward_input(float* dinp, const float* dout, const float* w, int N, int C, int OC);
void matmul_backward_weight(float* dw, float* dbias, const float* dout, const float* inp, int N,
                            int C, int OC);
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);
void gelu_forward(float* out, const float* inp, std::size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n);
void add(float* out, const float* a, const float* b, std::size_t n);
void accumulate(float* acc, const float* x, std::size_t n);
void zero(float* x, std::size_t n);
void scale(float* x, float s, std::size_t n);
double sum_squares(const float* x, std::size_t n);
void crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V);
void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                           int N, int V, int v_begin = 0);
void row_max(float* mx, const float* x, int N, int V);
void gather_target(float* z, const float* x, const int32_t* targets, int N, int V, int v_begin);
void softmax_exp(float* p, float* sum, const float* x, const float* mx, int N, int V);
void crossentropy_finish(float* losses, float* p, const float* sum, const float* mx,
                         const float* z_target, int N, int V);
void adamw_update(float* param, float* m, float* v, const float* grad, std::size_t n,
                  const pt::ops::AdamWStep& s);

// ---- device memory (for tests and the engine) -----------------------------------------------
void* alloc(std::size_t bytes); // cudaMalloc; throws when out of memory
void release(void* p);
void to_device(void* dst, const void* src, std::size_t bytes); // on the stream, then waits
void to_host(void* dst, const void* src, std::size_t bytes);   // on the stream, then waits

} // namespace pt::cuda_ops
