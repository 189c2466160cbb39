// A zero-initialized array in a backend's memory: kAlignBytes-aligned host memory by default, or
// whatever a Memory allocates (kernels/backend.hpp: GPU device memory). Movable, not copyable.
// Its bytes count in memory_count (the measured memory).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "util/memory_count.hpp"

namespace pt {

// Every buffer, and every tensor inside the flat parameter buffers, starts on this boundary
// (a cache line; what vector loads and cuBLAS want). The memory model counts with it too.
inline constexpr std::size_t kAlignBytes = 64;
inline constexpr std::size_t aligned_bytes(std::size_t bytes) {
  return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
}

// How a backend allocates its buffers; both null: the host's aligned_alloc / free.
struct Memory {
  void* (*alloc)(std::size_t bytes) = nullptr; // returns zeroed memory or throws
  void (*release)(void* p) = nullptr;
};

template <class T> class Buffer {
public:
  Buffer() = default;
  explicit Buffer(std::size_t n, const Memory& mem = {})
      : data_(nullptr, Free{mem.release, aligned_bytes(n * sizeof(T))}), n_(n) {
    if (n == 0) return;
    const std::size_t bytes = aligned_bytes(n * sizeof(T));
    void* p = nullptr;
    if (mem.alloc != nullptr) {
      p = mem.alloc(bytes);
    } else {
      p = std::aligned_alloc(kAlignBytes, bytes);
      if (p == nullptr) throw std::bad_alloc();
      std::memset(p, 0, bytes);
    }
    data_.reset(static_cast<T*>(p));
    memory_count::add(bytes);
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  T& operator[](std::size_t i) { return data_.get()[i]; }
  const T& operator[](std::size_t i) const { return data_.get()[i]; }

private:
  struct Free {
    void (*release)(void*) = nullptr;
    std::size_t bytes = 0;
    void operator()(T* p) const {
      memory_count::sub(bytes);
      if (release != nullptr) {
        release(p);
      } else {
        std::free(p);
      }
    }
  };
  std::unique_ptr<T, Free> data_;
  std::size_t n_ = 0;
};

using FloatBuffer = Buffer<float>;

} // namespace pt
