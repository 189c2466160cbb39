#include "telemetry/peak.hpp"

#include <chrono>

#include "ops.hpp"
#include <vector>

namespace pt {

double measure_sgemm_flops(double seconds, int n) {
  // 2048^3: eight blocks of the host products (kernels/host/gemm.hpp), so a rank's threads all
  // take part, as in the model's products
  // a probe, not training memory: plain vectors, outside the measured memory (memory_count)
  std::vector<float> a(static_cast<std::size_t>(n) * n), b(a.size()), c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 7) * 0.1f;
    b[i] = static_cast<float>(i % 5) * 0.1f;
  }
  using clock = std::chrono::steady_clock;
  // warm up (the threads' first products run slower) for a third of the time
  for (const auto w = clock::now();
       clock::now() - w < std::chrono::duration<double>(seconds / 3);) {
    ops::matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n);
  }
  const auto t0 = clock::now();
  int reps = 0;
  double elapsed = 0.0;
  do {
    ops::matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n);
    ++reps;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  } while (elapsed < seconds);
  return 2.0 * n * n * n * reps / elapsed;
}

} // namespace pt
