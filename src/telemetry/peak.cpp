#include "telemetry/peak.hpp"

#include <chrono>

#include "ops.hpp"
#include <vector>

namespace pt {

double measure_gemm_flops(double seconds, int m, int n, int k) {
  // a probe, not training memory: plain vectors, outside the measured memory (memory_count)
  const auto M = static_cast<std::size_t>(m), N = static_cast<std::size_t>(n),
             K = static_cast<std::size_t>(k);
  std::vector<float> a(M * K), b(N * K), c(M * N);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) * 0.1f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) * 0.1f;
  using clock = std::chrono::steady_clock;
  // warm up (the threads' first products run slower) for a third of the time
  for (const auto w = clock::now();
       clock::now() - w < std::chrono::duration<double>(seconds / 3);) {
    ops::matmul_forward(c.data(), a.data(), b.data(), nullptr, m, k, n);
  }
  const auto t0 = clock::now();
  int reps = 0;
  double elapsed = 0.0;
  do {
    ops::matmul_forward(c.data(), a.data(), b.data(), nullptr, m, k, n);
    ++reps;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  } while (elapsed < seconds);
  return 2.0 * m * n * k * reps / elapsed;
}

double measure_sgemm_flops(double seconds, int n) {
  // 2048^3: eight blocks of the host products (kernels/host/gemm.hpp), so a rank's threads all
  // take part, as in the model's products
  return measure_gemm_flops(seconds, n, n, n);
}

} // namespace pt
