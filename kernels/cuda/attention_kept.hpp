// What the CUDA backend's cuDNN attention keeps for the backward (kernels/cuda/ops_attention.cu),
// in plain C++: the planner counts a GPU rank's memory with it on machines without CUDA.
#pragma once

#include <cstddef>

namespace pt::cuda_ops {

// 256-byte aligned one after the other: each score row's log-sum-exp (B*NH*T floats), the
// output in bf16 (B*T*C) and qkv in bf16 (B*T*3C).
struct CudnnKept {
  std::size_t stats = 0, o16 = 0, qkv16 = 0, end = 0;
  CudnnKept(int B, int T, int C, int NH) {
    const auto up = [](std::size_t x) { return (x + 255) / 256 * 256; };
    const std::size_t rows = static_cast<std::size_t>(B) * T, bf16 = 2;
    o16 = up(sizeof(float) * rows * NH);
    qkv16 = o16 + up(bf16 * rows * C);
    end = qkv16 + bf16 * rows * 3 * C;
  }
};

} // namespace pt::cuda_ops
