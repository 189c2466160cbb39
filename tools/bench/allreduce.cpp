// OSU-style all-reduce benchmark: every comm.allreduce algorithm against MPI_Allreduce in one run.
//   mpirun -np 2 build/tools/bench/pt_bench_allreduce [max_bytes]
// Per message size: mean time over ranks (of the per-rank mean over iterations), algorithm
// bandwidth (bytes / time) and bus bandwidth (nccl-tests definition: algbw * 2(p-1)/p), and the
// ratio of each algorithm's time to MPI_Allreduce's (below 1: faster than MPI).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "comm/allreduce.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const std::size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (256u << 20);
  const char* names[] = {"mpi",          "ring",         "recursive-doubling",
                         "rabenseifner", "hierarchical", "torus2d"};
  if (rank == 0) {
    std::printf("all-reduce, float32 sum, %d ranks; time in us (mean over ranks), busbw GB/s, "
                "ratio = time / MPI_Allreduce time\n%12s",
                p, "bytes");
    for (const char* n : names) std::printf(" %24s", n);
    std::printf("\n");
  }
  for (std::size_t bytes = 8; bytes <= max_bytes; bytes *= 4) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> buf(n, 1.0f);
    const int iters = bytes < (1u << 20) ? 200 : (bytes < (16u << 20) ? 20 : 5);
    double t_mpi = 0.0;
    std::vector<float> scratch; // kept across calls, as the trainer does
    if (rank == 0) std::printf("%12zu", bytes);
    for (const char* name : names) {
      const pt::AllreduceAlgo algo = pt::allreduce_algo(name);
      pt::allreduce_sum(buf.data(), n, MPI_COMM_WORLD, algo, 1, &scratch); // warm-up
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) {
        pt::allreduce_sum(buf.data(), n, MPI_COMM_WORLD, algo, 1, &scratch);
      }
      double t = (MPI_Wtime() - t0) / iters;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      t /= p;
      if (algo == pt::AllreduceAlgo::mpi) t_mpi = t;
      const double busbw = static_cast<double>(bytes) / t * 2.0 * (p - 1) / p / 1e9;
      if (rank == 0) std::printf(" %9.1f %6.2f %6.2fx", t * 1e6, busbw, t / t_mpi);
      for (float& x : buf) x = 1.0f; // keep values bounded
    }
    if (rank == 0) std::printf("\n");
  }
  MPI_Finalize();
  return 0;
}
