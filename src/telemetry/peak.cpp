#include "telemetry/peak.hpp"

#include <chrono>

#include "ops.hpp"
#include <vector>

namespace pt {

double measure_sgemm_flops(double seconds) {
  constexpr int n = 512;
  // a probe, not training memory: plain vectors, outside the measured memory (memory_count)
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 7) * 0.1f;
    b[i] = static_cast<float>(i % 5) * 0.1f;
  }
  using clock = std::chrono::steady_clock;
  ops::matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n); // warm up
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
