// pipetrain-bench allreduce: OSU-style, each call timed alone between barriers, for
// MPI_Allreduce, every comm.allreduce algorithm, "auto" (its measured pick) and MPI_Allreduce
// again (the run's noise floor), interleaved call by call in an order drawn afresh every round,
// so that drift on a shared machine hits all columns alike. Each rank rewrites its buffer before
// every call, as the backward writes the gradients, so no column inherits the cache state another
// left, with values that differ from page to page as gradients do.
// t90 = max over ranks of the mean of each rank's fastest 90% of calls: a stalled call (a
// descheduled rank) does not decide. One row per size: MPI_Allreduce's t90 and bus bandwidth
// (nccl-tests: bytes / t90 * 2(p-1)/p), every column's t90 over MPI_Allreduce's, and the bar of
// docs/collectives.md: from 1 MiB the fastest of ours at most MPI_Allreduce's time, auto's pick
// within 25% of the fastest.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "comm/allreduce.hpp"
#include "common.hpp"
#include "util/errors.hpp"

namespace bench {
namespace {

const char* const kColumns[] = {"mpi",          "ring",         "recursive-doubling",
                                "rabenseifner", "hierarchical", "torus2d",
                                "auto",         "mpi-again"};
constexpr std::size_t kCols = 8, kAlgos = 5; // ring .. torus2d: columns 1 .. kAlgos
constexpr std::size_t kAuto = 6, kAgain = 7;

// What a backward leaves in a gradient bucket: values that differ from one 4 KiB page to the
// next (a hash of the index, whole numbers 0-255: sums over ranks stay exact).
void fill_like_gradients(float* buf, std::size_t n) {
  std::uint32_t h = 0;
  for (std::size_t i = 0; i < n; ++i, h += 2654435761u) buf[i] = static_cast<float>(h >> 24);
}

// Every column's t90 (max over ranks) at n floats (time_rounds: the first of the warm-up rounds
// makes scratch, windows and sub-communicators, and auto measures).
std::vector<double> time_columns(std::vector<std::unique_ptr<pt::Allreducer>>& cols, std::size_t n,
                                 double seconds, std::mt19937& shuffler) {
  std::vector<float> buf(n);
  return time_rounds(
      kCols,
      [&](std::size_t k) {
        fill_like_gradients(buf.data(), n);
        PT_MPI(MPI_Barrier(MPI_COMM_WORLD));
        const double t0 = MPI_Wtime();
        cols[k]->sum(buf.data(), n);
        return MPI_Wtime() - t0;
      },
      seconds, shuffler);
}

} // namespace

int bench_allreduce(const Args& a) {
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const double min_bytes = std::max(4.0, a.num("--min-bytes", 8));
  const double max_bytes = a.num("--max-bytes", 256.0 * 1048576);
  const double seconds = a.num("--seconds", 0.1); // per column and size, roughly
  const int g = ranks_per_node(a, MPI_COMM_WORLD);
  const pt::Topology topo = topology_from(a, std::max(1, p / g));
  std::vector<std::unique_ptr<pt::Allreducer>> cols;
  for (const char* name : kColumns) {
    pt::AllreduceOptions opt;
    opt.algo = pt::parse_allreduce(std::string(name) == "mpi-again" ? "mpi" : name);
    opt.node_size = g;
    opt.topology = topo;
    cols.push_back(std::make_unique<pt::Allreducer>(MPI_COMM_WORLD, opt));
  }
  if (rank == 0) {
    std::printf("# pipetrain-bench allreduce: float32 sum, %d ranks, %d per node, topology model "
                "%s\n# t90 of MPI_Allreduce (us) and its bus bandwidth; then each column's t90 "
                "over MPI_Allreduce's; best: the fastest of ours; auto/best: auto over the fastest "
                "column, MPI_Allreduce included; noise: MPI_Allreduce timed twice\n%10s %10s %9s",
                p, g, topo.name.c_str(), "bytes", "mpi_us", "busbw");
    for (std::size_t k = 1; k <= kAlgos; ++k) std::printf(" %9.9s", kColumns[k]);
    std::printf(" %9s %9s %-18s %9s %6s\n", "best", "auto", "auto picks", "auto/best", "noise");
  }
  double worst_best = 0.0, worst_auto = 0.0, worst_noise = 0.0;
  std::mt19937 shuffler(20261123);
  for (double bytes = min_bytes; bytes <= max_bytes * 1.0000001; bytes *= 2) {
    const std::size_t n = static_cast<std::size_t>(bytes) / sizeof(float);
    const std::vector<double> t = time_columns(cols, n, seconds, shuffler);
    const double real = static_cast<double>(n * sizeof(float)), mpi = t[0];
    double best = 1e30;
    for (std::size_t k = 1; k <= kAlgos; ++k) best = std::min(best, t[k] / mpi);
    const double rel = t[kAuto] / mpi / std::min(best, 1.0);
    worst_noise = std::max(worst_noise, std::max(t[kAgain] / mpi, mpi / t[kAgain]));
    if (real >= 1048576) {
      worst_best = std::max(worst_best, best);
      worst_auto = std::max(worst_auto, rel);
    }
    if (rank != 0) continue;
    std::printf("%10s %10.2f %9.3f", human(real).c_str(), mpi * 1e6,
                real / mpi / 1e9 * 2.0 * (p - 1) / p);
    for (std::size_t k = 1; k <= kAlgos; ++k) std::printf(" %9.2f", t[k] / mpi);
    std::printf(" %9.2f %9.2f %-18s %9.2f %6.2f\n", best, t[kAuto] / mpi,
                pt::algorithm_name(cols[kAuto]->algorithm_for(n)), rel, t[kAgain] / mpi);
    std::fflush(stdout);
  }
  if (rank == 0 && max_bytes >= 1048576) {
    std::printf("# from 1 MiB: the fastest of ours / MPI_Allreduce is at most %.2f (bar: 1.00, "
                "%s); auto is within %.1f%% of the fastest column (bar: 25%%, %s)\n",
                worst_best, worst_best <= 1.0 ? "met" : "missed", (worst_auto - 1.0) * 100.0,
                worst_auto <= 1.25 ? "met" : "missed");
  }
  if (rank == 0) {
    std::printf("# MPI_Allreduce timed twice differs by up to %.0f%% (the run's noise)\n",
                (worst_noise - 1.0) * 100.0);
  }
  return 0;
}

} // namespace bench
