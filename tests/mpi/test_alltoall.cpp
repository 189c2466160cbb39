// Every all-to-all algorithm (comm/alltoall.hpp) against MPI_Alltoallv: blocks of random sizes
// (zero included) with values that name their source, destination and position; hierarchical
// with emulated nodes of 1, 2 and 4 ranks and one node of all; auto, on the call that measures
// and after it; each under a hang watchdog. Prints "N passed, 0 failed" on rank 0; exit code 1
// on any mismatch. Arguments: the ranks per real host (default: all on one host; the two-host
// test gives 2); or --wrong-count: rank 1 sends rank 0 one float more than the counts it
// exchanged, which must end the job with the error naming both (never a hang).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "comm/alltoall.hpp"
#include "comm/watchdog.hpp"

namespace {

// This rank's send counts for a call (the same draw on every rank for its own row)
std::vector<int> send_counts(int rank, int p, int salt, int scale) {
  std::mt19937 rng(static_cast<unsigned>(rank * 7919 + salt * 104729));
  std::vector<int> c(static_cast<std::size_t>(p));
  for (int& x : c) x = static_cast<int>(rng() % static_cast<unsigned>(scale + 1));
  if (salt % 3 == 0) c[static_cast<std::size_t>((rank + 1) % p)] = 0; // empty blocks too
  return c;
}

bool exact(pt::Alltoaller& a, MPI_Comm comm, int salt, int scale) {
  int r = 0, p = 1;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &p);
  const std::vector<int> sc = send_counts(r, p, salt, scale);
  std::vector<int> rc(static_cast<std::size_t>(p)), sd(p + 1, 0), rd(p + 1, 0);
  a.exchange_counts(sc.data(), rc.data());
  std::vector<int> want_rc(static_cast<std::size_t>(p));
  MPI_Alltoall(sc.data(), 1, MPI_INT, want_rc.data(), 1, MPI_INT, comm);
  if (rc != want_rc) return false;
  for (int q = 0; q < p; ++q) sd[q + 1] = sd[q] + sc[q], rd[q + 1] = rd[q] + rc[q];
  std::vector<float> send(static_cast<std::size_t>(sd[p]));
  for (int q = 0; q < p; ++q) {
    for (int k = 0; k < sc[q]; ++k) send[sd[q] + k] = static_cast<float>((r * 64 + q) * 4096 + k);
  }
  std::vector<float> want(static_cast<std::size_t>(rd[p])), got(want.size(), -1.0f);
  MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_FLOAT, want.data(), rc.data(), rd.data(),
                MPI_FLOAT, comm);
  a.exchange(send.data(), sc.data(), got.data(), rc.data(),
             static_cast<std::size_t>(scale) * sizeof(float));
  return std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
}

int wrong_count(int rank, int p) {
  const pt::Watchdog watchdog(30.0, rank);
  pt::AlltoallOptions opt;
  opt.algo = pt::AlltoallAlgo::pairwise;
  opt.watchdog = &watchdog;
  opt.what = "the test's dispatch";
  pt::Alltoaller a(MPI_COMM_WORLD, opt);
  std::vector<int> sc(static_cast<std::size_t>(p), 4), rc(sc.size());
  a.exchange_counts(sc.data(), rc.data());
  if (rank == 1) sc[0] = 5; // then sends one float more than rank 0 was told
  std::vector<float> send(static_cast<std::size_t>(5 * p), 1.0f), recv(send.size());
  a.exchange(send.data(), sc.data(), recv.data(), rc.data(), 16);
  if (rank == 0) std::printf("FAIL: the wrong count went through\n");
  return 1;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc > 1 && std::strcmp(argv[1], "--wrong-count") == 0) return wrong_count(rank, size);
  const int per_host = argc > 1 ? std::atoi(argv[1]) : size;
  const pt::Watchdog watchdog(60.0, rank);
  int passed = 0, failed = 0;
  auto verdict = [&](bool ok, const std::string& what) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_CXX_BOOL, MPI_LAND, MPI_COMM_WORLD);
    ok ? ++passed : ++failed;
    if (!ok && rank == 0) std::printf("FAIL: %s on %d ranks\n", what.c_str(), size);
  };
  for (const char* name : {"mpi", "pairwise", "hierarchical", "auto"}) {
    for (int g : {1, 2, 4, size}) {
      if (std::strcmp(name, "hierarchical") != 0 && std::strcmp(name, "auto") != 0 && g != 1) {
        continue;
      }
      if (g > size || size % g != 0 || (per_host < size && g > per_host)) continue;
      pt::AlltoallOptions opt;
      opt.algo = pt::parse_alltoall(name);
      opt.node_size = g;
      opt.watchdog = &watchdog;
      pt::Alltoaller a(MPI_COMM_WORLD, opt);
      int salt = 0;
      for (int scale : {0, 1, 7, 1000, 70000}) {
        for (int call = 0; call < 2; ++call) { // auto: the measuring call, then its pick
          verdict(exact(a, MPI_COMM_WORLD, ++salt, scale),
                  std::string(name) + ", nodes of " + std::to_string(g) + ", blocks up to " +
                      std::to_string(scale) + " floats, call " + std::to_string(call + 1));
        }
      }
    }
  }
  if (rank == 0) std::printf("%d passed, %d failed\n", passed, failed);
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
