// pipetrain-bench allreduce: OSU-style, each call timed alone between barriers, for
// MPI_Allreduce, every comm.allreduce algorithm, "auto" (its measured pick) and MPI_Allreduce
// again (the run's noise floor), interleaved call by call in an order drawn afresh every round,
// so that drift on a shared machine hits all columns alike. Each rank rewrites its buffer before
// every call, as the backward writes the gradients, so no column inherits the cache state another
// left, with values that differ from page to page as gradients do.
// t90 = max over ranks of the mean of each rank's fastest 90% of calls: a stalled call (a
// descheduled rank) does not decide. algbw, busbw (nccl-tests: algbw * 2(p-1)/p) and vs_mpi
// (time / MPI_Allreduce's) use t90. The summary states the bar of docs/collectives.md: from
// 1 MiB the fastest of ours at most MPI_Allreduce's time, auto's pick within 25% of the fastest.
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
#include "pipetrain-bench/common.hpp"
#include "util/errors.hpp"

namespace bench {
namespace {

// What a backward leaves in a gradient bucket: values that differ from one 4 KiB page to the
// next (a hash of the index, whole numbers 0-255: sums over ranks stay exact).
void fill_like_gradients(float* buf, std::size_t n) {
  std::uint32_t h = 0;
  for (std::size_t i = 0; i < n; ++i, h += 2654435761u) buf[i] = static_cast<float>(h >> 24);
}

// The mean of the fastest 90% of the calls (at least one).
double t90_of(std::vector<double> calls) {
  std::sort(calls.begin(), calls.end());
  calls.resize(std::max<std::size_t>(1, calls.size() - calls.size() / 10));
  return std::accumulate(calls.begin(), calls.end(), 0.0) / static_cast<double>(calls.size());
}

struct Column {
  std::string name;
  std::unique_ptr<pt::Allreducer> red;
};

constexpr std::size_t kAlgos = 5; // ring .. torus2d: columns 1 .. kAlgos
constexpr std::size_t kAuto = 6, kAgain = 7;

struct Row {
  double bytes = 0.0;
  std::vector<double> ratio; // t90 / MPI_Allreduce's, per column
  std::string pick;          // auto's
};

void print_summary(const std::vector<Row>& rows, const std::vector<Column>& cols) {
  std::printf("\n# summary: time / MPI_Allreduce's; best: the fastest of ours; auto / fastest: "
              "auto's time over the fastest column (MPI_Allreduce included); noise: "
              "MPI_Allreduce timed twice\n%10s",
              "bytes");
  for (std::size_t k = 1; k <= kAlgos; ++k) std::printf(" %9.9s", cols[k].name.c_str());
  std::printf(" %9s %9s %-18s %9s %6s\n", "best", "auto", "auto picks", "auto/best", "noise");
  double worst_best = 0.0, worst_auto = 0.0, worst_noise = 0.0;
  bool big = false;
  for (const Row& r : rows) {
    std::printf("%10s", human(r.bytes).c_str());
    double best = 1e30;
    for (std::size_t k = 1; k <= kAlgos; ++k) {
      std::printf(" %9.2f", r.ratio[k]);
      best = std::min(best, r.ratio[k]);
    }
    const double rel = r.ratio[kAuto] / std::min(best, 1.0);
    std::printf(" %9.2f %9.2f %-18s %9.2f %6.2f\n", best, r.ratio[kAuto], r.pick.c_str(), rel,
                r.ratio[kAgain]);
    worst_noise = std::max(worst_noise, std::max(r.ratio[kAgain], 1.0 / r.ratio[kAgain]));
    if (r.bytes < 1048576) continue;
    big = true;
    worst_best = std::max(worst_best, best);
    worst_auto = std::max(worst_auto, rel);
  }
  if (big) {
    std::printf("# from 1 MiB: the fastest of ours / MPI_Allreduce is at most %.2f (bar: 1.00, "
                "%s); auto is within %.1f%% of the fastest column (bar: 25%%, %s)\n",
                worst_best, worst_best <= 1.0 ? "met" : "missed", (worst_auto - 1.0) * 100.0,
                worst_auto <= 1.25 ? "met" : "missed");
  }
  std::printf("# MPI_Allreduce timed twice differs by up to %.0f%% (the run's noise)\n",
              (worst_noise - 1.0) * 100.0);
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

  std::vector<Column> cols;
  for (const char* name : {"mpi", "ring", "recursive-doubling", "rabenseifner", "hierarchical",
                           "torus2d", "auto", "mpi-again"}) {
    pt::AllreduceOptions opt;
    const std::string deck_name = std::string(name) == "mpi-again" ? "mpi" : name;
    opt.algo = pt::parse_allreduce(deck_name);
    opt.node_size = g;
    opt.topology = topo;
    cols.push_back({name, std::make_unique<pt::Allreducer>(MPI_COMM_WORLD, opt)});
  }
  const std::size_t nc = cols.size();
  if (rank == 0) {
    std::printf("# pipetrain-bench allreduce: float32 sum, %d ranks, %d per node, topology model "
                "%s\n# avg/min/max: each rank's mean call, over ranks; t90: max over ranks of the "
                "mean of each rank's fastest 90%% of calls; algbw, busbw = algbw * 2(p-1)/p and "
                "vs_mpi (time / MPI_Allreduce's) from t90\n",
                p, g, topo.name.c_str());
    std::printf("%12s %-20s %11s %11s %11s %11s %11s %11s %8s\n", "bytes", "algorithm", "avg_us",
                "min_us", "max_us", "t90_us", "algbw_GB/s", "busbw_GB/s", "vs_mpi");
  }
  std::vector<Row> rows;
  std::vector<float> buf;
  std::vector<std::size_t> order(nc);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 shuffler(20261123);
  for (double bytes = min_bytes; bytes <= max_bytes * 1.0000001; bytes *= 2) {
    const std::size_t n = static_cast<std::size_t>(bytes) / sizeof(float);
    buf.assign(n, 0.0f);
    auto time_call = [&](std::size_t k) {
      fill_like_gradients(buf.data(), n);
      PT_MPI(MPI_Barrier(MPI_COMM_WORLD));
      const double t0 = MPI_Wtime();
      cols[k].red->sum(buf.data(), n);
      return MPI_Wtime() - t0;
    };
    // two warm-up rounds (the first makes scratch, windows and sub-communicators, and auto
    // measures); the second's mean sets the number of timed calls
    double est = 0.0;
    for (int round = 0; round < 2; ++round) {
      est = 0.0;
      for (std::size_t k = 0; k < nc; ++k) est += time_call(k) / static_cast<double>(nc);
    }
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &est, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    const int iters = std::clamp(static_cast<int>(seconds / std::max(est, 1e-7)), 30, 5000);
    std::vector<std::vector<double>> calls(nc);
    for (int it = 0; it < iters; ++it) {
      // the same order on every rank: one seed, and a draw that does not depend on the
      // standard library's distributions
      for (std::size_t i = nc - 1; i > 0; --i) std::swap(order[i], order[shuffler() % (i + 1)]);
      for (std::size_t k : order) calls[k].push_back(time_call(k));
    }
    std::vector<double> mean(nc), lo(nc), hi(nc), t90(nc);
    for (std::size_t k = 0; k < nc; ++k) {
      mean[k] = std::accumulate(calls[k].begin(), calls[k].end(), 0.0) / iters;
      t90[k] = t90_of(calls[k]);
    }
    const int count = static_cast<int>(nc);
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, t90.data(), count, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    PT_MPI(MPI_Allreduce(mean.data(), lo.data(), count, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
    PT_MPI(MPI_Allreduce(mean.data(), hi.data(), count, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, mean.data(), count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    Row row{static_cast<double>(n * sizeof(float)),
            {},
            pt::algorithm_name(cols[kAuto].red->algorithm_for(n))};
    for (std::size_t k = 0; k < nc; ++k) {
      const double algbw = row.bytes / t90[k] / 1e9;
      row.ratio.push_back(t90[k] / t90[0]);
      if (rank != 0) continue;
      const std::string name = k == kAuto ? "auto=" + row.pick : cols[k].name;
      std::printf("%12.0f %-20s %11.2f %11.2f %11.2f %11.2f %11.3f %11.3f %8.2f\n", row.bytes,
                  name.c_str(), mean[k] / p * 1e6, lo[k] * 1e6, hi[k] * 1e6, t90[k] * 1e6, algbw,
                  algbw * 2.0 * (p - 1) / p, row.ratio.back());
    }
    const auto m = cols[kAuto].red->measured().find(n);
    if (rank == 0 && m != cols[kAuto].red->measured().end()) { // why auto picked what it did
      std::printf("%12.0f # auto's measurement (us, the faster of two calls, max over ranks; "
                  "model: %s):",
                  row.bytes, pt::algorithm_name(m->second.model));
      for (const auto& [algo, sec] : m->second.seconds) {
        std::printf(" %s %.2f", pt::algorithm_name(algo), sec * 1e6);
      }
      std::printf("\n");
    }
    if (rank == 0) std::fflush(stdout);
    rows.push_back(row);
  }
  if (rank == 0) print_summary(rows, cols);
  return 0;
}

} // namespace bench
