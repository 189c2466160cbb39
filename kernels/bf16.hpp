// bfloat16 on the host: the top 16 bits of an IEEE float, rounded to nearest even (as
// torch.bfloat16 and CUDA's __float2bfloat16_rn round). The activation format bf16
// (docs/precision.md) stores these; a float holding a rounded value converts to and from bf16
// exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pt::bf16 {

inline std::uint16_t from_float(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u); // NaN
  u += 0x7fffu + ((u >> 16) & 1u); // to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

inline float to_float(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float x = 0.0f;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline float round(float x) {
  return to_float(from_float(x));
}

// out[i] = from_float(x[i]), and out[i] = to_float(h[i]), for i < n (distinct buffers)
inline void pack(std::uint16_t* out, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = from_float(x[i]);
}
inline void unpack(float* out, const std::uint16_t* h, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = to_float(h[i]);
}

} // namespace pt::bf16
