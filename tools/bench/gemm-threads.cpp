// What thread-count-invariant products cost (docs/performance.md): the host kernels' matrix
// products at T threads (their output cut into blocks fixed by the shape, one single-threaded
// oneDNN call a block: kernels/host/gemm.hpp) against oneDNN threading each product itself at T
// threads, and against one thread, on the host benchmark model's shapes (N = B*T = 2048 rows,
// C = 384; inputs/bench-host.toml). Usage: pt_bench_gemm_threads [T (default: every core)]
// Prints one line per product: GFLOP/s of each way and the blocked over oneDNN's own ratio.
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "ops.hpp"

namespace {

double gflops(double flop, const std::function<void()>& f) {
  f(); // warm up
  const auto t0 = std::chrono::steady_clock::now();
  int reps = 0;
  double dt = 0.0;
  do {
    f();
    ++reps;
    dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (dt < 0.5);
  return flop * reps / dt / 1e9;
}

} // namespace

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1])
                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const pt::ops::HostThreads threads(T);
  const int N = 2048, C = 384;
  struct Product {
    const char* name;
    int OC, IC;
    char kind; // f: forward (N,OC) = (N,IC) W^T; i: input gradient; w: weight gradient
  } products[] = {{"qkv forward", 3 * C, C, 'f'},         {"proj forward", C, C, 'f'},
                  {"fc forward", 4 * C, C, 'f'},          {"fc2 forward", C, 4 * C, 'f'},
                  {"qkv input gradient", 3 * C, C, 'i'},  {"proj input gradient", C, C, 'i'},
                  {"fc input gradient", 4 * C, C, 'i'},   {"fc2 input gradient", C, 4 * C, 'i'},
                  {"qkv weight gradient", 3 * C, C, 'w'}, {"proj weight gradient", C, C, 'w'},
                  {"fc weight gradient", 4 * C, C, 'w'},  {"fc2 weight gradient", C, 4 * C, 'w'}};
  std::printf("matrix products at %d thread(s), GFLOP/s (Kokkos %s%s)\n", T,
              pt::ops::host_space_name(),
              pt::ops::host_threads_available() ? "" : ": no threads, the blocks run in turn");
  std::printf("%-22s %6s %6s %6s %12s %12s %12s %8s\n", "product", "M", "N", "K", "1 thread",
              "oneDNN's own", "blocked", "ratio");
  double sum_own = 0.0, sum_blocked = 0.0;
  for (const Product& p : products) {
    const std::size_t nx = static_cast<std::size_t>(N) * p.IC,
                      nw = static_cast<std::size_t>(p.OC) * p.IC,
                      ny = static_cast<std::size_t>(N) * p.OC;
    std::vector<float> x(nx, 0.5f), w(nw, 0.25f), y(ny, 0.125f), out(std::max({nx, nw, ny}));
    // (M, N, K) of the product and the oneDNN call that computes it, row-major as the kernels
    int m = N, n = p.OC, k = p.IC;
    std::function<void()> blocked, own;
    if (p.kind == 'f') {
      blocked = [&] {
        pt::ops::matmul_forward(out.data(), x.data(), w.data(), nullptr, N, p.IC, p.OC);
      };
      own = [&] {
        dnnl_sgemm('N', 'T', N, p.OC, p.IC, 1.0f, x.data(), p.IC, w.data(), p.IC, 0.0f, out.data(),
                   p.OC);
      };
    } else if (p.kind == 'i') {
      n = p.IC, k = p.OC;
      blocked = [&] {
        pt::ops::matmul_backward_input(out.data(), y.data(), w.data(), N, p.IC, p.OC);
      };
      own = [&] {
        dnnl_sgemm('N', 'N', N, p.IC, p.OC, 1.0f, y.data(), p.OC, w.data(), p.IC, 0.0f, out.data(),
                   p.IC);
      };
    } else {
      m = p.OC, n = p.IC, k = N;
      blocked = [&] {
        pt::ops::matmul_backward_weight(out.data(), nullptr, y.data(), x.data(), N, p.IC, p.OC);
      };
      own = [&] {
        dnnl_sgemm('T', 'N', p.OC, p.IC, N, 1.0f, y.data(), p.OC, x.data(), p.IC, 1.0f, out.data(),
                   p.IC);
      };
    }
    const double flop = 2.0 * m * n * k;
    omp_set_num_threads(1);
    const double one = gflops(flop, own);
    omp_set_num_threads(T);
    const double threaded = gflops(flop, own);
    omp_set_num_threads(1); // the kernels' own setting (HostThreads)
    const double blk = gflops(flop, blocked);
    sum_own += threaded, sum_blocked += blk;
    std::printf("%-22s %6d %6d %6d %12.1f %12.1f %12.1f %7.2fx\n", p.name, m, n, k, one, threaded,
                blk, blk / threaded);
  }
  std::printf("mean of the products: blocked %.2fx oneDNN's own threading\n",
              sum_blocked / sum_own);
  return 0;
}
