#include "cuda/device_query.hpp"

namespace pt::cuda {

#ifndef PT_HAVE_CUDA
bool compiled() {
  return false;
}
int device_count(std::string& why) {
  why = "this pipetrain was built without CUDA (no nvcc at configure time)";
  return 0;
}
#endif

} // namespace pt::cuda
