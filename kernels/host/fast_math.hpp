// Branch-free exp/tanh that GCC vectorizes inside plain loops (glibc's expf/tanhf only
// vectorize under -ffast-math, which would also loosen the numerics we pin against PyTorch).
// fast_exp: Cody-Waite range reduction x = k*ln2 + r, |r| <= ln2/2, degree-6 Taylor polynomial
// for exp(r) (truncation error < 2e-8 relative), 2^k assembled in the exponent bits.
// What keeps the loops vectorizable with GCC 12 (-fopt-info-vec): k is rounded to the nearest
// even integer by adding and subtracting 1.5 * 2^23 (exact for |k| < 2^22; GCC calls libm for
// __builtin_roundevenf, which stops vectorization), and the clamp's compares become blends only
// under -fno-trapping-math (kernels/CMakeLists.txt), which changes no value.
#pragma once

#include <bit>
#include <cstdint>

namespace pt::ops::detail {

inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // round to nearest even (-std=c++20: no FMA contraction, so the product is rounded first)
  const float kf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  // ln2 split in two so k*ln2_hi is exact in float
  float r = x - kf * 0.693359375f;
  r = r + kf * 2.12194440e-4f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t k = static_cast<int32_t>(kf);
  const float two_k = std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23);
  return p * two_k;
}

// tanh(u) = 1 - 2/(exp(2u)+1); absolute error ~1e-7, which is what GELU needs
// (it only ever uses 1 + tanh and 1 - tanh^2).
inline float fast_tanh(float u) {
  return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f);
}

} // namespace pt::ops::detail
