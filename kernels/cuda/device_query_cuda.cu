// First CUDA translation unit: device discovery through the runtime, linked with cuBLAS so the
// toolchain (nvcc + cuBLAS) is exercised by every build that has nvcc.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/device_query.hpp"

namespace pt::cuda {

bool compiled() {
  return true;
}

int device_count(std::string& why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    return 0;
  }
  int version = 0;
  cublasHandle_t handle = nullptr;
  if (n > 0 && cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS) {
    cublasGetVersion(handle, &version);
    cublasDestroy(handle);
  }
  why = "cuBLAS " + std::to_string(version);
  return n;
}

double device_memory_bytes(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return 0.0;
  return static_cast<double>(prop.totalGlobalMem);
}

} // namespace pt::cuda
