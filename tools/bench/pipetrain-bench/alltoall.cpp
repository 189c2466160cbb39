// pipetrain-bench alltoall: OSU-style like the all-reduce's (time_rounds), for MPI_Alltoallv,
// every comm/alltoall.hpp algorithm, "auto" (its measured pick) and MPI_Alltoallv again (the
// run's noise floor), with every rank sending every rank a block of the row's size (the bytes a
// rank sends in all: p blocks). One row per size: MPI_Alltoallv's t90 and each column's t90 over
// it; best: the fastest of ours; the bar of docs/moe.md: from 64 KiB the fastest of ours at most
// MPI_Alltoallv's time.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/alltoall.hpp"
#include "common.hpp"
#include "util/errors.hpp"

namespace bench {
namespace {

const char* const kColumns[] = {"mpi", "pairwise", "hierarchical", "auto", "mpi-again"};
constexpr std::size_t kCols = 5, kAlgos = 2, kAuto = 3, kAgain = 4; // ours: columns 1 .. kAlgos

} // namespace

int bench_alltoall(const Args& a) {
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const double min_bytes = std::max(4.0 * p, a.num("--min-bytes", 8));
  const double max_bytes = a.num("--max-bytes", 16.0 * 1048576);
  const double seconds = a.num("--seconds", 0.1);
  const int g = ranks_per_node(a, MPI_COMM_WORLD);
  const pt::Topology topo = topology_from(a, std::max(1, p / g));
  std::vector<std::unique_ptr<pt::Alltoaller>> cols;
  for (const char* name : kColumns) {
    pt::AlltoallOptions opt;
    opt.algo = pt::parse_alltoall(std::string(name) == "mpi-again" ? "mpi" : name);
    opt.node_size = g;
    opt.topology = topo;
    cols.push_back(std::make_unique<pt::Alltoaller>(MPI_COMM_WORLD, opt));
  }
  if (rank == 0) {
    std::printf("# pipetrain-bench alltoall: float32 blocks, %d ranks, %d per node, topology "
                "model %s\n# bytes: what a rank sends in all (p equal blocks); t90 of "
                "MPI_Alltoallv (us); each column's t90 over MPI_Alltoallv's; best: the fastest "
                "of ours; noise: MPI_Alltoallv timed twice\n%10s %10s",
                p, g, topo.name.c_str(), "bytes", "mpi_us");
    for (std::size_t k = 1; k <= kAlgos; ++k) std::printf(" %12.12s", kColumns[k]);
    std::printf(" %9s %9s %-13s %6s\n", "best", "auto", "auto picks", "noise");
  }
  double worst_best = 0.0, worst_noise = 0.0;
  std::mt19937 shuffler(20261128);
  for (double bytes = min_bytes; bytes <= max_bytes * 1.0000001; bytes *= 2) {
    const int each = std::max(1, static_cast<int>(bytes / sizeof(float)) / p);
    const std::vector<int> counts(static_cast<std::size_t>(p), each);
    std::vector<float> send(static_cast<std::size_t>(each) * p, 1.0f), recv(send.size());
    const std::size_t cls = static_cast<std::size_t>(each) * sizeof(float);
    const std::vector<double> t = time_rounds(
        kCols,
        [&](std::size_t k) {
          PT_MPI(MPI_Barrier(MPI_COMM_WORLD));
          const double t0 = MPI_Wtime();
          cols[k]->exchange(send.data(), counts.data(), recv.data(), counts.data(), cls);
          return MPI_Wtime() - t0;
        },
        seconds, shuffler);
    const double real = static_cast<double>(send.size() * sizeof(float)), mpi = t[0];
    double best = 1e30;
    for (std::size_t k = 1; k <= kAlgos; ++k) best = std::min(best, t[k] / mpi);
    worst_noise = std::max(worst_noise, std::max(t[kAgain] / mpi, mpi / t[kAgain]));
    if (real >= 65536) worst_best = std::max(worst_best, best);
    if (rank != 0) continue;
    std::printf("%10s %10.2f", human(real).c_str(), mpi * 1e6);
    for (std::size_t k = 1; k <= kAlgos; ++k) std::printf(" %12.2f", t[k] / mpi);
    std::printf(" %9.2f %9.2f %-13s %6.2f\n", best, t[kAuto] / mpi,
                pt::alltoall_name(cols[kAuto]->algorithm_for(cls)), t[kAgain] / mpi);
    std::fflush(stdout);
  }
  if (rank == 0 && max_bytes >= 65536) {
    std::printf("# from 64 KiB: the fastest of ours / MPI_Alltoallv is at most %.2f, i.e. ours "
                "at least %.2fx (bar: 1.00x, %s)\n",
                worst_best, 1.0 / worst_best, worst_best <= 1.0 ? "met" : "missed");
    std::printf("# MPI_Alltoallv timed twice differs by up to %.0f%% (the run's noise)\n",
                (worst_noise - 1.0) * 100.0);
  }
  return 0;
}

} // namespace bench
