// What tests/unit/test_parity.cpp checks against the PyTorch fixture: the backend under test and
// its tolerances. pt_unit_tests defines parity_target() for the host (in test_parity.cpp); the
// CUDA tests define it in tests/cuda/parity_main.cpp.
#pragma once

#include "backend.hpp"
#include "config/enums.hpp"

namespace pt {

// tensor_tol: relative L2 error per tensor (and relative error of the loss and gradient norm)
// against the float64 reference; loss_tol: relative error of each of the ten training losses;
// exact_split: the split backward must equal the fused one bit for bit; format: the stage's
// activation format (docs/precision.md).
struct ParityTarget {
  const Backend* backend;
  double tensor_tol;
  double loss_tol;
  bool exact_split;
  ActFormat format = ActFormat::fp32;
};
ParityTarget parity_target();

} // namespace pt
