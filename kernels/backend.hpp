// One kernel backend, chosen at run time by device.kind: its memory, its ordering, and the ops of
// kernels/ops.hpp as function pointers. The model, the optimizer and the pipeline engine call
// through this table, so the same code runs on the host and on a GPU.
//
// Memory rule: every buffer of a backend is readable and writable by the host code (MPI,
// checkpoints, the sampler) once synchronize() has returned. On the host that holds at all
// times; the CUDA backend allocates managed memory (cudaMallocManaged), which the driver moves
// between the GPU and the host on use, and queues its ops on one stream, so synchronize() waits
// for them. Calls that return numbers (sum_squares, sum_squares_each) wait by themselves.
//
// Default arguments do not travel through function pointers: callers pass every argument.
#pragma once

#include <cstddef>

#include "ops.hpp"

// The ops of ops_list.inc that a Backend carries, by name, in field order. A backend fills its
// table with PT_BACKEND_OPS(X) where X(op) names its own function, so every table has every op.
// clang-format off
#define PT_BACKEND_OPS(X)                                                                     \
  X(encoder_forward) X(encoder_backward)                                                      \
  X(layernorm_forward) X(layernorm_backward_input) X(layernorm_backward_weight)               \
  X(matmul_forward) X(matmul_backward_input) X(matmul_backward_weight)                        \
  X(attention_forward) X(attention_backward)                                                  \
  X(gelu_forward) X(gelu_backward) X(add) X(accumulate) X(zero) X(scale) X(sum_squares)       \
  X(sum_squares_each)                                                                         \
  X(crossentropy_forward) X(crossentropy_backward)                                            \
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

#define PT_BACKEND_FIELD(op) decltype(&ops::op) op;
  PT_BACKEND_OPS(PT_BACKEND_FIELD)
#undef PT_BACKEND_FIELD

  bool on_host() const {
    return alloc == nullptr;
  }
};

// The host backend (kernels/host: Kokkos loops and the build's BLAS).
const Backend& host_backend();
// The host backend with its memory treated as a device's (on_host() is false): every path
// that keeps MPI and MPI-IO off a GPU backend's memory runs on the host, with the same numbers
// (tests: PIPETRAIN_TEST_STAGED=1).
const Backend& host_staged_backend();

} // namespace pt
