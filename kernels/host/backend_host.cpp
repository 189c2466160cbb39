#include <dlfcn.h>

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

std::size_t attention_floats(int B, int T, int /*C*/, int NH) {
  return static_cast<std::size_t>(B) * NH * T * T;
}

// The test guard (tests/staging/mpi_guard.cpp, loaded with LD_PRELOAD) learns the staged
// "device" blocks through this function and fails any MPI or HDF5 call handed one of them.
// Without the guard the lookup finds nothing.
using GuardFn = void (*)(const void* p, std::size_t bytes); // bytes 0: released
GuardFn guard() {
  static const GuardFn fn =
      reinterpret_cast<GuardFn>(dlsym(RTLD_DEFAULT, "pt_mpi_guard_device_block"));
  return fn;
}

void* staged_alloc(std::size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  if (guard() != nullptr) guard()(p, bytes);
  return p;
}

void staged_release(void* p) {
  if (guard() != nullptr && p != nullptr) guard()(p, 0);
  std::free(p);
}

} // namespace

const Backend& host_backend() {
  static const Backend table{.name = "host",
                             .alloc = nullptr,
                             .release = nullptr,
                             .copy = host_copy,
                             .synchronize = host_synchronize,
                             .blas_name = ops::blas_name,
                             .mark = nullptr,
                             .seconds = nullptr,
                             .attention_floats = attention_floats,
                             .attention_keeps_qkv = nullptr, // no copy of qkv in att
                             .attention_scratch = ops::attention_scratch_floats,
                             .bf16_products = nullptr, // fp32 products: rounds are kept
#define PT_HOST_OP(op) .op = ops::op,
                             PT_BACKEND_OPS(PT_HOST_OP)
#undef PT_HOST_OP
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
