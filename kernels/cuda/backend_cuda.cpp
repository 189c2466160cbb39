// The CUDA backend's table (kernels/backend.hpp): cuda_ops on device memory (cudaMalloc).
#include "cuda/device_query.hpp"
#include "cuda/ops_cuda.hpp"

namespace pt::cuda {
namespace {

void synchronize() { // the table's: also starts the markers' numbers over (Backend::mark)
  cuda_ops::synchronize();
  cuda_ops::restart_marks();
}

// attention_backward uses device scratch of its own (kernels/cuda/ops_cuda.hpp); the table's
// (T,T) tile is kept as before
std::size_t attention_scratch(int /*B*/, int T, int /*NH*/) {
  return static_cast<std::size_t>(T) * T;
}

} // namespace

const Backend& start(int device, const std::string& precision, const std::string& attention) {
  cuda_ops::init(device);
  cuda_ops::set_precision(precision);
  cuda_ops::set_attention(attention);
  static const Backend table{.name = "cuda",
                             .alloc = cuda_ops::alloc_zeroed,
                             .release = cuda_ops::release,
                             .copy = cuda_ops::copy,
                             .synchronize = synchronize,
                             .blas_name = cuda_ops::blas_name,
                             .mark = cuda_ops::mark,
                             .seconds = cuda_ops::seconds,
                             .attention_floats = cuda_ops::attention_floats,
                             .attention_keeps_qkv = cuda_ops::attention_keeps_qkv,
                             .attention_scratch = attention_scratch,
                             .bf16_products = cuda_ops::bf16_products,
#define PT_CUDA_OP(op) .op = cuda_ops::op,
                             PT_BACKEND_OPS(PT_CUDA_OP)
#undef PT_CUDA_OP
  };
  return table;
}

double measure_gemm_flops(double seconds) {
  return cuda_ops::measure_gemm_flops(seconds);
}

} // namespace pt::cuda
