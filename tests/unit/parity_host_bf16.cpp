// The PyTorch-fixture parity tests (tests/unit/test_parity.cpp) on the host backend with the bf16
// activation format (docs/precision.md): every stored activation and activation gradient rounded
// to bfloat16, the arithmetic and the weights fp32. Against the float64 reference with the bf16
// tolerances of the CUDA test (tests/cuda/parity_main.cpp): eps = 2^-8, each tensor within
// 8 eps, each training loss within 2 eps; the split backward still equals the fused one bit for
// bit. (main: test_main.cpp.)
#include "parity_target.hpp"

namespace pt {

ParityTarget parity_target() {
  constexpr double eps = 1.0 / 256.0;
  return {&host_backend(), 8 * eps, 2 * eps, true, ActFormat::bf16};
}

} // namespace pt
