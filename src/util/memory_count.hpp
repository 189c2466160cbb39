// The bytes live in pipetrain's own allocations and their peak: every Buffer (util/buffer.hpp,
// host or a backend's device memory) and every CountedVector (scratch and MPI staging vectors)
// adds and subtracts its size here. This is the measured memory of metrics.jsonl (mem_bytes);
// docs/memory.md says what it leaves out. Process-wide, like the heap it counts.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

namespace pt::memory_count {

inline std::atomic<std::size_t> live_bytes{0};
inline std::atomic<std::size_t> peak_bytes{0};

inline void add(std::size_t bytes) {
  const std::size_t now = live_bytes.fetch_add(bytes) + bytes;
  std::size_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
}
inline void sub(std::size_t bytes) {
  live_bytes.fetch_sub(bytes);
}
inline std::size_t live() {
  return live_bytes.load();
}
inline std::size_t peak() {
  return peak_bytes.load();
}

// std::allocator that counts.
template <class T> struct Allocator {
  using value_type = T;
  Allocator() = default;
  template <class U> Allocator(const Allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    T* p = std::allocator<T>().allocate(n);
    add(n * sizeof(T));
    return p;
  }
  void deallocate(T* p, std::size_t n) noexcept {
    sub(n * sizeof(T));
    std::allocator<T>().deallocate(p, n);
  }
  template <class U> bool operator==(const Allocator<U>&) const noexcept { return true; }
};

} // namespace pt::memory_count

namespace pt {
// A std::vector whose memory counts in memory_count (scratch, staging copies).
template <class T> using CountedVector = std::vector<T, memory_count::Allocator<T>>;

// Scratch of at least n elements, grown to exactly n: std::vector's own growth may double the
// capacity and hold up to twice the largest request, which the memory model does not count. The
// contents are not kept when it grows.
template <class T> void grow_scratch(CountedVector<T>& v, std::size_t n) {
  if (v.capacity() < n) v = CountedVector<T>(); // freed first: never both at once
  if (v.size() < n) v.resize(n);
}
} // namespace pt
