// Every all-reduce algorithm against MPI_Allreduce on integer-valued float data (exact in any
// summation order), counts 0, 1, p-1, odd and large, in place; hierarchical with emulated node
// sizes. Prints "N passed, 0 failed" on rank 0; exit code 1 on any mismatch.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "comm/allreduce.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* names[] = {"mpi",          "ring",         "recursive-doubling",
                         "rabenseifner", "hierarchical", "torus2d"};
  const std::size_t counts[] = {0, 1, static_cast<std::size_t>(size - 1), 7, 1000, 100003};
  int passed = 0, failed = 0;
  for (const char* name : names) {
    for (int node : {0, 1, 2, 4}) {
      if (node != 0 && std::strcmp(name, "hierarchical") != 0) continue;
      for (std::size_t n : counts) {
        std::vector<float> want(n), got(n);
        for (std::size_t i = 0; i < n; ++i) {
          want[i] = got[i] = static_cast<float>((rank * 31 + static_cast<int>(i % 97)) % 1000);
        }
        if (n > 0) {
          MPI_Allreduce(MPI_IN_PLACE, want.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
        }
        pt::allreduce_sum(got.data(), n, MPI_COMM_WORLD, pt::allreduce_algo(name), node);
        int ok = std::memcmp(want.data(), got.data(), n * sizeof(float)) == 0 ? 1 : 0;
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (ok) {
          ++passed;
        } else {
          ++failed;
          if (rank == 0) std::printf("FAIL: %s node %d n %zu on %d ranks\n", name, node, n, size);
        }
      }
    }
  }
  if (rank == 0) std::printf("%d passed, %d failed\n", passed, failed);
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
