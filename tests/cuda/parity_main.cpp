// GoogleTest main for the PyTorch-fixture parity tests (tests/unit/test_parity.cpp) on the CUDA
// backend at PT_PARITY_PRECISION. With no visible GPU it prints why and exits 77, which CTest
// reports as skipped.
//
// Tolerances (docs/cuda.md): fp32 keeps the host's 1e-4 per tensor; the training losses get
// 1e-4 too, because sums with atomics change the last bits from run to run and AdamW carries
// them on. bf16 rounds every matrix-product input and stored activation to 8 significant bits: eps
// = 2^-8 (the spacing of bf16 numbers at 1); each tensor may differ by 8 eps (3.1e-2) and each
// training loss by 2 eps (7.8e-3).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "cuda/device_query.hpp"
#include "ops.hpp"
#include "parity_target.hpp"

#ifndef PT_PARITY_PRECISION
#error "PT_PARITY_PRECISION must be \"fp32\" or \"bf16\""
#endif

namespace pt {
namespace {
const Backend* g_backend = nullptr;
}

ParityTarget parity_target() {
  const std::string p = PT_PARITY_PRECISION;
  if (p == "bf16") {
    constexpr double eps = 1.0 / 256.0;
    return {g_backend, 8 * eps, 2 * eps, false, ActFormat::bf16};
  }
  return {g_backend, 1e-4, 1e-4, false};
}

} // namespace pt

int main(int argc, char** argv) {
  std::string why;
  const int n = pt::cuda::device_count(why);
  if (n == 0) {
    std::printf("SKIP: no CUDA device visible (%s)\n", why.c_str());
    return 77;
  }
  MPI_Init(&argc, &argv);
  int result = 0;
  {
    const pt::ops::HostThreads threads(1);
    pt::g_backend = &pt::cuda::start(0, PT_PARITY_PRECISION);
    std::printf("CUDA backend, precision %s\n", PT_PARITY_PRECISION);
    ::testing::InitGoogleTest(&argc, argv);
    result = RUN_ALL_TESTS();
  }
  MPI_Finalize();
  return result;
}
