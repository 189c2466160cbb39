// What the CUDA side of this build can do, and the way in to the CUDA backend. Every function
// here exists in every build; without nvcc they report that CUDA was not compiled in.
#pragma once

#include <string>

#include "backend.hpp"

namespace pt::cuda {

// True when this binary contains CUDA code (built with nvcc found).
bool compiled();
// Number of visible CUDA devices; 0 with `why` filled when none can be used.
int device_count(std::string& why);

// Selects `device` for this process, sets the precision of its matrix products
// (fp32 | tf32 | bf16, see cuda_ops::set_precision) and its attention kernels (device.attention,
// cuda_ops::set_attention) and returns the CUDA backend's table. Throws std::runtime_error when
// CUDA is not compiled in, the device cannot be used or the attention asked for is not built.
const Backend& start(int device, const std::string& precision,
                     const std::string& attention = "auto");
// Bytes of memory on GPU `device`; 0 when there is none (or CUDA is not compiled in).
double device_memory_bytes(int device);
// FLOP/s of a large matrix product at the started backend's precision (the MFU denominator).
double measure_gemm_flops(double seconds);

} // namespace pt::cuda
