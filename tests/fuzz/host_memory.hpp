// The host backend's memory rules without its kernels (they are not built for fuzzing), for the
// targets that build stages (fuzz_checkpoint, fuzz_safetensors): buffers in host memory (alloc
// null: on_host() is true, as on the host backend), copies by memcpy. The loaders call no op; a
// call to one would be a null call, a finding.
#pragma once

#include <cstddef>
#include <cstring>

#include "backend.hpp"

namespace fuzz {

inline void host_copy(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}
inline void host_synchronize() {}
inline const char* no_blas() {
  return "none";
}
inline std::size_t attention_floats(int B, int T, int /*C*/, int NH) {
  return static_cast<std::size_t>(B) * NH * T * T;
}
// one thread's (T,T) tile: no kernels run here, so no threads
inline std::size_t attention_scratch(int /*B*/, int T, int /*NH*/) {
  return static_cast<std::size_t>(T) * T;
}
inline const pt::Backend kHostMemory{.name = "host (memory only)",
                                     .alloc = nullptr,
                                     .release = nullptr,
                                     .copy = host_copy,
                                     .synchronize = host_synchronize,
                                     .blas_name = no_blas,
                                     .mark = nullptr,
                                     .seconds = nullptr,
                                     .attention_floats = attention_floats,
                                     .attention_scratch = attention_scratch};

} // namespace fuzz
