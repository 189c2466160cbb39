// The CUDA backend's table (kernels/backend.hpp): cuda_ops on managed memory.
#include "cuda/device_query.hpp"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda {

const Backend& start(int device, const std::string& precision) {
  cuda_ops::init(device);
  cuda_ops::set_precision(precision);
  static const Backend table{
      .name = "cuda",
      .alloc = cuda_ops::alloc_managed,
      .release = cuda_ops::release,
      .copy = cuda_ops::copy,
      .synchronize = cuda_ops::synchronize,
      .blas_name = cuda_ops::blas_name,
      .encoder_forward = cuda_ops::encoder_forward,
      .encoder_backward = cuda_ops::encoder_backward,
      .layernorm_forward = cuda_ops::layernorm_forward,
      .layernorm_backward_input = cuda_ops::layernorm_backward_input,
      .layernorm_backward_weight = cuda_ops::layernorm_backward_weight,
      .matmul_forward = cuda_ops::matmul_forward,
      .matmul_backward_input = cuda_ops::matmul_backward_input,
      .matmul_backward_weight = cuda_ops::matmul_backward_weight,
      .attention_forward = cuda_ops::attention_forward,
      .attention_backward = cuda_ops::attention_backward,
      .gelu_forward = cuda_ops::gelu_forward,
      .gelu_backward = cuda_ops::gelu_backward,
      .add = cuda_ops::add,
      .accumulate = cuda_ops::accumulate,
      .zero = cuda_ops::zero,
      .scale = cuda_ops::scale,
      .sum_squares = cuda_ops::sum_squares,
      .crossentropy_forward = cuda_ops::crossentropy_forward,
      .crossentropy_backward = cuda_ops::crossentropy_backward,
      .row_max = cuda_ops::row_max,
      .gather_target = cuda_ops::gather_target,
      .softmax_exp = cuda_ops::softmax_exp,
      .crossentropy_finish = cuda_ops::crossentropy_finish,
      .adamw_update = cuda_ops::adamw_update,
  };
  return table;
}

double measure_gemm_flops(double seconds) {
  return cuda_ops::measure_gemm_flops(seconds);
}

} // namespace pt::cuda
