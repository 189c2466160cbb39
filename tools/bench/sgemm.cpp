// sgemm throughput of one BLAS library on the matrix shapes pipetrain's host path runs.
// Built once per library (PT_BENCH_OPENBLAS / PT_BENCH_BLIS / PT_BENCH_DNNL) so their symbols
// never meet in one binary. Usage: pt_bench_sgemm_<lib> THREADS
// Prints one line per shape: "<lib> threads=<t> M N K GFLOP/s".
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#if defined(PT_BENCH_OPENBLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
static const char* kLib = "openblas";
static void set_threads(int t) {
  openblas_set_num_threads(t);
}
static void gemm(int M, int N, int K, const float* A, const float* B, float* C) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
}
#elif defined(PT_BENCH_BLIS)
#include <blis.h>
static const char* kLib = "blis";
static void set_threads(int t) {
  bli_thread_set_num_threads(t);
}
static void gemm(int M, int N, int K, const float* A, const float* B, float* C) {
  float one = 1.0f, zero = 0.0f;
  bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, M, N, K, &one, const_cast<float*>(A), K, 1,
            const_cast<float*>(B), N, 1, &zero, C, N, 1);
}
#elif defined(PT_BENCH_DNNL)
#include <dnnl.h>
#include <omp.h>
static const char* kLib = "onednn";
static void set_threads(int t) {
  omp_set_num_threads(t);
}
static void gemm(int M, int N, int K, const float* A, const float* B, float* C) {
  dnnl_sgemm('N', 'N', M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
}
#endif

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  set_threads(threads);
  // (M, N, K): the benchmark model's linear layers at N = B*T = 2048 rows, forward and weight
  // gradient, plus a large square product for the machine's peak
  const int shapes[][3] = {{2048, 1152, 384}, {2048, 1536, 384}, {2048, 384, 1536},
                           {1536, 384, 2048}, {256, 256, 64},    {2048, 2048, 2048}};
  for (const auto& s : shapes) {
    const int M = s[0], N = s[1], K = s[2];
    std::vector<float> A(static_cast<std::size_t>(M) * K, 0.5f),
        B(static_cast<std::size_t>(K) * N, 0.25f), C(static_cast<std::size_t>(M) * N);
    gemm(M, N, K, A.data(), B.data(), C.data()); // warm up
    const double flop = 2.0 * M * N * K;
    int reps = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double dt = 0.0;
    do {
      gemm(M, N, K, A.data(), B.data(), C.data());
      ++reps;
      dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (dt < 0.5 || reps < 3);
    std::printf("%s threads=%d %d %d %d %.1f\n", kLib, threads, M, N, K, flop * reps / dt / 1e9);
  }
  return 0;
}
