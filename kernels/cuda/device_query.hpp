// What the CUDA side of this build can do. The GPU kernels themselves come with the GPU issue;
// until then a deck asking for device.kind="cuda" is refused with this explanation.
#pragma once

#include <string>

namespace pt::cuda {

// True when this binary contains CUDA code (built with nvcc found).
bool compiled();
// Number of visible CUDA devices; 0 with `why` filled when none can be used.
int device_count(std::string& why);

} // namespace pt::cuda
