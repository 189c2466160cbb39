// One kernel backend, chosen at run time by device.kind: its memory, its ordering, and the ops of
// kernels/ops.hpp as function pointers. The model, the optimizer and the pipeline engine call
// through this table, so the same code runs on the host and on a GPU.
//
// Memory rule: every buffer of a backend is readable and writable by the host code (MPI,
// checkpoints, the sampler) once synchronize() has returned. On the host that holds at all
// times; the CUDA backend allocates managed memory (cudaMallocManaged), which the driver moves
// between the GPU and the host on use, and queues its ops on one stream, so synchronize() waits
// for them. Calls that return a number (sum_squares) wait by themselves.
//
// Default arguments do not travel through function pointers: callers pass every argument.
#pragma once

#include <cstddef>

#include "ops.hpp"

namespace pt {

struct Backend {
  const char* name; // "host", "cuda"
  // this backend's memory (returned zeroed); both null on the host: aligned_alloc / free
  void* (*alloc)(std::size_t bytes);
  void (*release)(void* p);
  void (*copy)(void* dst, const void* src, std::size_t bytes); // ordered with the ops
  void (*synchronize)();                                       // host may touch memory after
  const char* (*blas_name)();

  decltype(&ops::encoder_forward) encoder_forward;
  decltype(&ops::encoder_backward) encoder_backward;
  decltype(&ops::layernorm_forward) layernorm_forward;
  decltype(&ops::layernorm_backward_input) layernorm_backward_input;
  decltype(&ops::layernorm_backward_weight) layernorm_backward_weight;
  decltype(&ops::matmul_forward) matmul_forward;
  decltype(&ops::matmul_backward_input) matmul_backward_input;
  decltype(&ops::matmul_backward_weight) matmul_backward_weight;
  decltype(&ops::attention_forward) attention_forward;
  decltype(&ops::attention_backward) attention_backward;
  decltype(&ops::gelu_forward) gelu_forward;
  decltype(&ops::gelu_backward) gelu_backward;
  decltype(&ops::add) add;
  decltype(&ops::accumulate) accumulate;
  decltype(&ops::zero) zero;
  decltype(&ops::scale) scale;
  decltype(&ops::sum_squares) sum_squares;
  decltype(&ops::crossentropy_forward) crossentropy_forward;
  decltype(&ops::crossentropy_backward) crossentropy_backward;
  decltype(&ops::row_max) row_max;
  decltype(&ops::gather_target) gather_target;
  decltype(&ops::softmax_exp) softmax_exp;
  decltype(&ops::crossentropy_finish) crossentropy_finish;
  decltype(&ops::adamw_update) adamw_update;

  bool on_host() const { return alloc == nullptr; }
};

// The host backend (kernels/host: Kokkos loops and the build's BLAS).
const Backend& host_backend();
// The host backend with its memory treated as a device's (on_host() is false): every path
// that keeps MPI and MPI-IO off a GPU backend's memory runs on the host, with the same numbers
// (tests: PIPETRAIN_TEST_STAGED=1).
const Backend& host_staged_backend();

} // namespace pt
