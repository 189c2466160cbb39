// pipetrain-bench gemm: this host's rate of the model's matrix product by shape, as a planner
// machine file's `gemm` rows (docs/planner.md). One process, this rank's threads.
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "common.hpp"
#include "telemetry/peak.hpp"

namespace bench {

int bench_gemm(const Args& a) {
  std::vector<int> sizes;
  std::stringstream list(a.get("--sizes", "256,512,1024,2048"));
  for (std::string item; std::getline(list, item, ',');) {
    const int n = std::atoi(item.c_str());
    if (n <= 0 || n > 16384) throw std::invalid_argument("--sizes wants sizes in 1..16384");
    sizes.push_back(n);
  }
  const double seconds = a.num("--seconds", 0.2);
  std::printf("# (m x k) times (k x n) products of this host's kernels, TFLOP/s; every m, n, k in "
              "--sizes\ngemm = [");
  bool first = true;
  for (int m : sizes) {
    for (int n : sizes) {
      for (int k : sizes) {
        const double flops = pt::measure_gemm_flops(seconds, m, n, k);
        std::printf("%s\n  [%d, %d, %d, %.5f]", first ? "" : ",", m, n, k, flops / 1e12);
        std::fflush(stdout);
        first = false;
      }
    }
  }
  std::printf("]\n");
  return 0;
}

} // namespace bench
