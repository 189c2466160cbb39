// The machine's measured sgemm rate, the denominator of host MFU (docs/performance.md).
#pragma once

namespace pt {

// FLOP/s of n^3 sgemm through the kernel API on this rank (its threads), measured for about
// `seconds` (at least one product after one of warm-up).
double measure_sgemm_flops(double seconds, int n = 2048);

} // namespace pt
