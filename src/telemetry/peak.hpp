// The machine's measured sgemm rate, the denominator of host MFU (docs/performance.md).
#pragma once

namespace pt {

// FLOP/s of 2048^3 sgemm through the kernel API on this rank (its threads), measured for about
// `seconds`.
double measure_sgemm_flops(double seconds);

} // namespace pt
