// Counter-based randomness: the same (seed, counters) give the same value on every rank and in
// every layout, with no generator state to carry.
#pragma once

#include <cstdint>

namespace pt {

// SplitMix64 finalizer (Steele, Lea, Flood, "Fast splittable pseudorandom number generators").
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline std::uint64_t hash3(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return mix64(a ^ mix64(b ^ mix64(c)));
}

// Uniform in (0, 1], 53 bits.
inline double unit_open0(std::uint64_t h) {
  return (static_cast<double>(h >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

} // namespace pt
