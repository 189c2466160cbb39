#include "cuda/device_query.hpp"

#include <stdexcept>

namespace pt::cuda {

#ifndef PT_HAVE_CUDA
namespace {
constexpr const char* kNotCompiled =
    "this pipetrain was built without CUDA (no nvcc at configure time)";
}

bool compiled() {
  return false;
}
int device_count(std::string& why) {
  why = kNotCompiled;
  return 0;
}
const Backend& start(int, const std::string&, const std::string&) {
  throw std::runtime_error(kNotCompiled);
}
double device_memory_bytes(int) {
  return 0.0;
}
double measure_gemm_flops(double) {
  throw std::runtime_error(kNotCompiled);
}
#endif

} // namespace pt::cuda
