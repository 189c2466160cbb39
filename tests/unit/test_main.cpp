// GoogleTest main for pipetrain unit tests: MPI (single rank) and the host threads (one: ctest
// runs tests side by side; tests/threads runs 2) around the tests.
#include <gtest/gtest.h>
#include <mpi.h>

#include "ops.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int result = 0;
  {
    const pt::ops::HostThreads threads(1);
    ::testing::InitGoogleTest(&argc, argv);
    result = RUN_ALL_TESTS();
  }
  MPI_Finalize();
  return result;
}
