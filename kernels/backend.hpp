// One kernel backend, chosen at run time by device.kind: its memory, its ordering, and the ops of
// kernels/ops.hpp as function pointers. The model, the optimizer and the pipeline engine call
// through this table, so the same code runs on the host and on a GPU.
//
// Memory rule: host code (MPI, checkpoints, the sampler, digests) reads and writes a backend's
// buffers only through copy() (to_host / from_host below), unless on_host(). The CUDA backend's
// buffers are plain device memory (cudaMalloc), which the host cannot touch; its ops and copies
// queue on one stream, and synchronize() waits for them. Calls that return numbers
// (sum_squares, sum_squares_each) wait by themselves.
//
// Default arguments do not travel through function pointers: callers pass every argument.
#pragma once

#include <cstddef>
#include <vector>

#include "ops.hpp"

// The ops of ops_list.inc that a Backend carries, by name, in field order. A backend fills its
// table with PT_BACKEND_OPS(X) where X(op) names its own function, so every table has every op.
// clang-format off
#define PT_BACKEND_OPS(X)                                                                     \
  X(encoder_forward) X(encoder_backward)                                                      \
  X(layernorm_forward) X(layernorm_backward_input) X(layernorm_backward_weight)               \
  X(rmsnorm_forward) X(rmsnorm_backward_input) X(rmsnorm_backward_weight)                     \
  X(rope_forward) X(rope_backward) X(swiglu_forward) X(swiglu_backward)                       \
  X(kv_expand) X(kv_reduce)                                                                   \
  X(matmul_forward) X(matmul_backward_input) X(matmul_backward_weight) X(matmul_backward)    \
  X(matmul_forward_packed) X(matmul_backward_packed)                                          \
  X(attention_forward) X(attention_backward)                                                  \
  X(gelu_forward) X(gelu_backward) X(gelu_forward_packed) X(gelu_backward_packed)            \
  X(add) X(accumulate) X(residual_add) X(zero) X(scale)                                       \
  X(sum_squares)                                                                              \
  X(round_bf16) X(pack_bf16) X(unpack_bf16) X(sum_squares_each)                              \
  X(crossentropy_forward) X(crossentropy_backward) X(crossentropy_forward_backward)           \
  X(row_max) X(gather_target) X(softmax_exp) X(crossentropy_finish)                           \
  X(adamw_update)
// clang-format on

namespace pt {

struct Backend {
  const char* name; // "host", "cuda"
  // this backend's memory (returned zeroed); both null on the host: aligned_alloc / free
  void* (*alloc)(std::size_t bytes);
  void (*release)(void* p);
  void (*copy)(void* dst, const void* src, std::size_t bytes); // ordered with the ops
  void (*synchronize)();                                       // host may touch memory after
  const char* (*blas_name)();
  // Device timing (both null on the host): mark() records a marker in the backend's queue and
  // returns its number; seconds(a, b) is the time between two markers once synchronize() has
  // returned. Numbers count up from 0 again after each synchronize().
  int (*mark)();
  double (*seconds)(int from, int to);
  // Floats of the att buffer attention_forward fills for its backward: B*NH*T*T (the
  // probabilities) on the host; a GPU's flash kernels keep less (kernels/cuda/ops_cuda.hpp).
  std::size_t (*attention_floats)(int B, int T, int C, int NH);
  // True where att also keeps a copy of qkv, so attention_backward does not read its qkv
  // argument (a GPU's cuDNN or flash attention; null: false, as on the host).
  bool (*attention_keeps_qkv)(int B, int T, int C, int NH);
  // Floats of attention_backward's scratch: a (T,T) tile per thread on the host (at most B*NH).
  std::size_t (*attention_scratch)(int B, int T, int NH);
  // True where the matrix products and attention convert their fp32 inputs to bfloat16 (round
  // to nearest even) themselves: a GPU at precision bf16. An input already rounded then gives
  // the same bits, so the model skips rounds whose only consumers are products (null: false).
  bool (*bf16_products)();

#define PT_BACKEND_FIELD(op) decltype(&ops::op) op;
  PT_BACKEND_OPS(PT_BACKEND_FIELD)
#undef PT_BACKEND_FIELD

  bool on_host() const {
    return alloc == nullptr;
  }
};

// dst (host) = n values of backend memory src; returns when they have arrived.
template <class T> void to_host(const Backend& be, T* dst, const T* src, std::size_t n) {
  be.copy(dst, src, n * sizeof(T));
  be.synchronize();
}
// p itself where the host can read it (on_host()), else its n values copied into `host`.
template <class T>
const T* readable(const Backend& be, const T* p, std::size_t n, std::vector<T>& host) {
  if (be.on_host()) return p;
  host.resize(n);
  to_host(be, host.data(), p, n);
  return host.data();
}
// dst (backend memory) = n host values src; returns when src may be reused.
template <class T> void from_host(const Backend& be, T* dst, const T* src, std::size_t n) {
  be.copy(dst, src, n * sizeof(T));
  be.synchronize();
}

// The host backend (kernels/host: Kokkos loops and the build's BLAS).
const Backend& host_backend();
// The host backend with its memory treated as a device's (on_host() is false): every path
// that keeps MPI and MPI-IO off a GPU backend's memory runs on the host, with the same numbers
// (tests: PIPETRAIN_TEST_STAGED=1).
const Backend& host_staged_backend();
// The host backend with a GPU's bf16 products (tests: PIPETRAIN_TEST_BF16_PRODUCTS=1): products
// and attention round their inputs to bfloat16 first, as the CUDA backend's at precision bf16
// convert them, and bf16_products() is true, so the GPU's paths of the model run on the host
// (kernels/host/bf16_products.cpp).
const Backend& host_bf16_products_backend();

} // namespace pt
