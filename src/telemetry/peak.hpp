// The machine's measured sgemm rate, the denominator of host MFU (docs/performance.md).
#pragma once

namespace pt {

// FLOP/s of n^3 sgemm through the kernel API on this rank (its threads), measured for about
// `seconds` (at least one product after one of warm-up).
double measure_sgemm_flops(double seconds, int n = 2048);
// FLOP/s of the model's product (m x k rows times a k x n weight, kernels/ops.hpp's
// matmul_forward) on this rank, likewise: a planner machine file's gemm rows on the host.
double measure_gemm_flops(double seconds, int m, int n, int k);

} // namespace pt
