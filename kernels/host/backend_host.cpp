#include <cstdlib>
#include <cstring>
#include <new>

#include "backend.hpp"

namespace pt {
namespace {

void host_copy(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void host_synchronize() {}

void* staged_alloc(std::size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return p;
}

void staged_release(void* p) {
  std::free(p);
}

} // namespace

const Backend& host_backend() {
  static const Backend table{
      .name = "host",
      .alloc = nullptr,
      .release = nullptr,
      .copy = host_copy,
      .synchronize = host_synchronize,
      .blas_name = ops::blas_name,
      .encoder_forward = ops::encoder_forward,
      .encoder_backward = ops::encoder_backward,
      .layernorm_forward = ops::layernorm_forward,
      .layernorm_backward_input = ops::layernorm_backward_input,
      .layernorm_backward_weight = ops::layernorm_backward_weight,
      .matmul_forward = ops::matmul_forward,
      .matmul_backward_input = ops::matmul_backward_input,
      .matmul_backward_weight = ops::matmul_backward_weight,
      .attention_forward = ops::attention_forward,
      .attention_backward = ops::attention_backward,
      .gelu_forward = ops::gelu_forward,
      .gelu_backward = ops::gelu_backward,
      .add = ops::add,
      .accumulate = ops::accumulate,
      .zero = ops::zero,
      .scale = ops::scale,
      .sum_squares = ops::sum_squares,
      .crossentropy_forward = ops::crossentropy_forward,
      .crossentropy_backward = ops::crossentropy_backward,
      .row_max = ops::row_max,
      .gather_target = ops::gather_target,
      .softmax_exp = ops::softmax_exp,
      .crossentropy_finish = ops::crossentropy_finish,
      .adamw_update = ops::adamw_update,
  };
  return table;
}

const Backend& host_staged_backend() {
  static const Backend table = [] {
    Backend b = host_backend();
    b.name = "host-staged";
    b.alloc = staged_alloc;
    b.release = staged_release;
    return b;
  }();
  return table;
}

} // namespace pt
