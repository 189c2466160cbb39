// pipetrain-bench: the communication benchmarks and the all-reduce cost model.
//   mpirun -np P build/pipetrain-bench allreduce [--min-bytes 8] [--max-bytes 268435456]
//          [--ranks-per-node N] [--topology T | --calibration FILE] [--seconds 0.1]
//   build/pipetrain-bench simulate --nodes N [--ranks-per-node G] [--topology T | --calibration F]
//   mpirun -np P build/pipetrain-bench calibrate [--out calibration.toml] [--ranks-per-node N]
//   mpirun -np P build/pipetrain-bench window [--samples 60]   (all ranks on one node)
//   mpirun -np P build/pipetrain-bench instances [--instances 6] [--rounds 16]
//          [--stores adaptive|cached|streaming|KIND,KIND,...] [--windows own|shared]
//          (all ranks on one node)
//   mpirun -np P build/pipetrain-bench cma [--calls 30] [--max-bytes 67108864] (one node)
// allreduce: OSU-style (each call timed alone between barriers; avg/min/max over ranks of each
// rank's mean) for MPI_Allreduce, every comm.allreduce algorithm, "auto" (measured choice),
// "model" (auto with comm.autotune = false), MPI_Allreduce again (the run's noise floor) and
// hierarchical again, interleaved call by call so that drift on a shared machine hits all columns
// alike. Each rank rewrites its buffer before every call, as the backward writes the gradients, so
// no column inherits the cache state another one left (a call that follows the same algorithm
// measured up to 30% slower without it), with values that differ from page to page as gradients do
// (not zeros), and the order of the columns is shuffled in every round. The columns share one pool
// of shared-memory windows (pt::WindowPool), so hierarchical, auto and model step through the
// same memory; hierarchical again has a window of its own, and its ratio to hierarchical shows
// how much a window's memory alone moves the time (10-20% over seconds on the 2-core VM,
// docs/collectives.md, "Stop 23").
// t90 = max over ranks of the mean of each rank's fastest 90% of calls: a stalled call (a
// descheduled rank) moves a mean of 10 calls by 2x, and a median flips between two levels a
// time alternates between; algbw, busbw (nccl-tests: algbw * 2(p-1)/p) and vs_mpi (time /
// MPI_Allreduce's) use t90. simulate: the topology model's time of each algorithm on N nodes,
// next to the bandwidth bound. calibrate: measures alpha, beta (MPI_Sendrecv exchanges) inside a
// node and between nodes, and gamma (float32 sums), and writes the TOML that comm.calibration
// reads. window: per sample, the round trip of a cache line between two cores and hierarchical's
// window step with each kind of stores against MPI_Allreduce (docs/collectives.md). instances:
// several instances of hierarchical side by side, each with its own window (the spread between
// windows, and windows whose ranks store differently) or, with --windows shared, all through one.
// cma: the window step against a single copy through process_vm_readv (a probe: would reading
// the other ranks' buffers directly be faster here?) and MPI_Allreduce.
#include <mpi.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/topology.hpp"
#include "util/errors.hpp"

namespace {

// What a backward leaves in a gradient bucket before its all-reduce: values that differ from one
// 4 KiB page to the next (a hash of the index, whole numbers 0-255: sums over ranks stay exact).
void fill_like_gradients(float* buf, std::size_t n) {
  std::uint32_t h = 0;
  for (std::size_t i = 0; i < n; ++i, h += 2654435761u) buf[i] = static_cast<float>(h >> 24);
}

struct Args {
  std::vector<std::string> rest;
  std::string get(const std::string& flag, const std::string& fallback) const {
    for (std::size_t i = 0; i + 1 < rest.size(); ++i) {
      if (rest[i] == flag) return rest[i + 1];
    }
    return fallback;
  }
  double num(const std::string& flag, double fallback) const {
    const std::string v = get(flag, "");
    if (v.empty()) return fallback;
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !(x >= 0)) {
      throw std::invalid_argument(flag + " wants a non-negative number, got \"" + v + "\"");
    }
    return x;
  }
};

std::string human(double bytes) {
  char b[32];
  if (bytes >= 1048576) {
    std::snprintf(b, sizeof b, "%.0f MiB", bytes / 1048576);
  } else if (bytes >= 1024) {
    std::snprintf(b, sizeof b, "%.0f KiB", bytes / 1024);
  } else {
    std::snprintf(b, sizeof b, "%.0f B", bytes);
  }
  return b;
}

pt::Topology topology_from(const Args& a, int nodes) {
  return pt::resolve_topology(a.get("--topology", "auto"), a.get("--calibration", ""), nodes);
}

// Ranks per node: --ranks-per-node, or the size of this rank's shared-memory group when every
// node holds the same number of ranks (else 1).
int ranks_per_node(const Args& a, MPI_Comm comm) {
  const int given = static_cast<int>(a.num("--ranks-per-node", 0));
  if (given > 0) return given;
  MPI_Comm sh;
  PT_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &sh));
  int g = 1, lo = 0, hi = 0;
  PT_MPI(MPI_Comm_size(sh, &g));
  PT_MPI(MPI_Comm_free(&sh));
  PT_MPI(MPI_Allreduce(&g, &lo, 1, MPI_INT, MPI_MIN, comm));
  PT_MPI(MPI_Allreduce(&g, &hi, 1, MPI_INT, MPI_MAX, comm));
  return lo == hi ? g : 1;
}

// ---- allreduce --------------------------------------------------------------------------------

// The window step's store choosers of the instances given (name, Allreducer) at one size, every
// rank's (each chooses alone): the kind in use and both kinds' smoothed ns per float. Two
// instances that run the same algorithm at different speeds often differ here.
void print_window_stores(double bytes, std::size_t n,
                         const std::vector<std::pair<const char*, const pt::Allreducer*>>& inst,
                         const std::vector<std::array<double, 2>>& step_us, int rank, int p) {
  constexpr std::size_t kv = 6; // values per instance and rank
  const std::size_t m = inst.size();
  std::vector<double> mine(kv * m);
  int have = 1;
  for (std::size_t i = 0; i < m; ++i) {
    const auto st = inst[i].second->window_stores_of(n);
    if (!st) {
      have = 0;
      continue;
    }
    mine[kv * i] = st->kind();
    mine[kv * i + 1] = st->per_float(0) * 1e9;
    mine[kv * i + 2] = st->per_float(1) * 1e9;
    mine[kv * i + 3] = static_cast<double>(st->segments_timed());
    mine[kv * i + 4] = step_us[i][0];
    mine[kv * i + 5] = step_us[i][1];
  }
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (have == 0) return; // no window, or cached stores only at this size
  std::vector<double> all(rank == 0 ? mine.size() * static_cast<std::size_t>(p) : 0);
  PT_MPI(MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                    static_cast<int>(mine.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD));
  if (rank != 0) return;
  std::printf("%12.0f # window stores per rank (kind in use, 0 cached 1 streaming; ns per float "
              "cached/streaming; segments timed; per timed call, us: the step's timed parts + "
              "the untimed wait after the copy-in):",
              bytes);
  for (std::size_t i = 0; i < m; ++i) {
    std::printf(" %s", inst[i].first);
    for (int r = 0; r < p; ++r) {
      const double* v = &all[(static_cast<std::size_t>(r) * m + i) * kv];
      std::printf(" r%d %.0f %.3f/%.3f %.0f %.1f+%.1f", r, v[0], v[1], v[2], v[3], v[4], v[5]);
    }
  }
  std::printf("\n");
}

int bench_allreduce(const Args& a) {
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const double min_bytes = std::max(4.0, a.num("--min-bytes", 8));
  const double max_bytes = a.num("--max-bytes", 256.0 * 1048576);
  const double seconds = a.num("--seconds", 0.1); // per column and size, roughly
  const int g = ranks_per_node(a, MPI_COMM_WORLD);
  const pt::Topology topo = topology_from(a, std::max(1, p / g));

  struct Column {
    std::string name;
    std::unique_ptr<pt::Allreducer> red;
  };
  std::vector<Column> cols;
  const auto pool = std::make_shared<pt::WindowPool>(); // freed with the columns
  for (const char* name : {"mpi", "ring", "recursive-doubling", "rabenseifner", "hierarchical",
                           "torus2d", "auto", "model", "mpi-again", "hierarchical-again"}) {
    pt::AllreduceOptions opt;
    std::string deck_name = name;
    if (deck_name == "model") deck_name = "auto";
    if (deck_name == "mpi-again") deck_name = "mpi";
    if (deck_name == "hierarchical-again") deck_name = "hierarchical";
    opt.algo = pt::parse_allreduce(deck_name);
    opt.tune = std::string(name) == "auto";
    opt.node_size = g;
    opt.topology = topo;
    if (std::string(name) != "hierarchical-again") opt.windows = pool;
    cols.push_back({name, std::make_unique<pt::Allreducer>(MPI_COMM_WORLD, opt)});
  }
  const std::size_t nc = cols.size();
  const std::size_t n_algos = 5; // ring .. torus2d: columns 1 .. n_algos
  const std::size_t k_auto = 6, k_model = 7, k_again = 8, k_hier_again = 9;
  const std::size_t k_hier = 4; // the fifth name above
  if (rank == 0) {
    std::printf("# pipetrain-bench allreduce: float32 sum, %d ranks, %d per node, topology model "
                "%s\n# avg/min/max: each rank's mean call, over ranks; t90: max over ranks of the "
                "mean of each rank's fastest 90%% of calls; algbw, busbw = algbw * 2(p-1)/p and "
                "vs_mpi (time / MPI_Allreduce's) from t90\n",
                p, g, topo.name.c_str());
    std::printf("%12s %-20s %11s %11s %11s %11s %11s %11s %8s\n", "bytes", "algorithm", "avg_us",
                "min_us", "max_us", "t90_us", "algbw_GB/s", "busbw_GB/s", "vs_mpi");
  }
  struct Row {
    double bytes;
    std::vector<double> ratio;
    std::string auto_pick, model_pick;
    std::size_t pick_column = 0; // the column that runs auto's pick alone
    std::string auto_changes;    // switches/re-measurements of auto's pick, "-": still measuring
  };
  std::vector<Row> rows;
  std::vector<float> buf;
  std::vector<std::size_t> order(nc);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 shuffler(20261123);
  for (double bytes = min_bytes; bytes <= max_bytes * 1.0000001; bytes *= 2) {
    const std::size_t n = static_cast<std::size_t>(bytes) / sizeof(float);
    buf.assign(n, 0.0f); // rewritten before every call
    // warm-up rounds of every column as the timed ones run (the first allocates scratch,
    // windows and sub-communicators), at least two and until auto has measured its choice;
    // the last one's mean time per call sets the number of timed calls
    auto time_call = [&](std::size_t k) {
      fill_like_gradients(buf.data(), n); // fresh in this rank's cache, as after
      MPI_Barrier(MPI_COMM_WORLD);        // a backward, whatever ran before
      const double t0 = MPI_Wtime();
      cols[k].red->sum(buf.data(), n);
      return MPI_Wtime() - t0;
    };
    double est = 0.0;
    const pt::Allreducer& tuned = *cols[k_auto].red;
    for (int round = 0; round < 2 || !tuned.settled(n); ++round) {
      double t = 0.0;
      for (std::size_t k = 0; k < nc; ++k) t += time_call(k);
      est = t / static_cast<double>(nc);
    }
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &est, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    // at least 30 calls a column: with 10 (the 128 and 256 MiB rows at --seconds 0.3), t90
    // kept 9, and two stalled calls of a column (1.5-2.8x, seen in both window-step columns
    // alike) decided a row
    const int iters = std::clamp(static_cast<int>(seconds / std::max(est, 1e-7)), 30, 5000);
    std::vector<std::vector<double>> calls(nc);
    const std::array<std::size_t, 3> traced = {k_hier, k_hier_again, k_auto};
    std::array<pt::WindowStepTimes, 3> before;
    for (std::size_t i = 0; i < traced.size(); ++i) {
      before[i] = cols[traced[i]].red->window_step_times();
    }
    for (int it = 0; it < iters; ++it) {
      // every column once per round, in an order drawn afresh (the same on every rank: one seed,
      // and a draw that does not depend on the standard library's distributions), so that no
      // column always follows the same one and inherits its traces in the caches
      for (std::size_t i = nc - 1; i > 0; --i) std::swap(order[i], order[shuffler() % (i + 1)]);
      for (std::size_t k : order) calls[k].push_back(time_call(k));
    }
    std::vector<double> mean(nc), lo(nc), hi(nc), t90(nc);
    for (std::size_t k = 0; k < nc; ++k) {
      double total = 0.0;
      for (double x : calls[k]) total += x;
      mean[k] = total / iters;
      t90[k] = pt::mean_of_fastest(calls[k], 10); // the fastest 90% of the calls
    }
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, t90.data(), static_cast<int>(nc), MPI_DOUBLE, MPI_MAX,
                         MPI_COMM_WORLD));
    PT_MPI(MPI_Allreduce(mean.data(), lo.data(), static_cast<int>(nc), MPI_DOUBLE, MPI_MIN,
                         MPI_COMM_WORLD));
    PT_MPI(MPI_Allreduce(mean.data(), hi.data(), static_cast<int>(nc), MPI_DOUBLE, MPI_MAX,
                         MPI_COMM_WORLD));
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, mean.data(), static_cast<int>(nc), MPI_DOUBLE, MPI_SUM,
                         MPI_COMM_WORLD));
    Row row{static_cast<double>(n * sizeof(float)), {}, {}, {}, 0, {}};
    row.auto_pick = pt::algorithm_name(cols[k_auto].red->algorithm_for(n));
    for (std::size_t k = 1; k <= n_algos; ++k) {
      if (cols[k].name == row.auto_pick) row.pick_column = k;
    }
    const auto tr = cols[k_auto].red->tuned().find(n);
    row.auto_changes =
        tr == cols[k_auto].red->tuned().end()
            ? "-"
            : std::to_string(tr->second.switches) + "/" + std::to_string(tr->second.remeasures);
    row.model_pick = pt::algorithm_name(cols[k_model].red->algorithm_for(n));
    for (std::size_t k = 0; k < nc; ++k) {
      const double avg = mean[k] / p;
      const double algbw = row.bytes / t90[k] / 1e9;
      row.ratio.push_back(t90[k] / t90[0]);
      if (rank == 0) {
        std::string name = cols[k].name;
        if (k == k_auto) name += "=" + row.auto_pick;
        if (k == k_model) name += "=" + row.model_pick;
        std::printf("%12.0f %-20s %11.2f %11.2f %11.2f %11.2f %11.3f %11.3f %8.2f\n", row.bytes,
                    name.c_str(), avg * 1e6, lo[k] * 1e6, hi[k] * 1e6, t90[k] * 1e6, algbw,
                    algbw * 2.0 * (p - 1) / p, row.ratio.back());
      }
    }
    if (rank == 0 && tr != cols[k_auto].red->tuned().end()) { // why auto picked what it did
      std::printf("%12.0f # auto's last measurement (us, max over ranks; one that dropped out: its "
                  "fastest call at the drop):",
                  row.bytes);
      for (const auto& [algo, sec] : tr->second.seconds) {
        std::printf(" %s %.2f", pt::algorithm_name(algo), sec * 1e6);
      }
      std::printf("\n");
    }
    std::vector<std::pair<const char*, const pt::Allreducer*>> inst;
    std::vector<std::array<double, 2>> step_us; // per timed call of each traced column
    for (std::size_t i = 0; i < traced.size(); ++i) {
      const Column& col = cols[traced[i]];
      const pt::WindowStepTimes now = col.red->window_step_times();
      inst.emplace_back(col.name.c_str(), col.red.get());
      step_us.push_back(
          {(now.timed - before[i].timed) / iters * 1e6, (now.wait - before[i].wait) / iters * 1e6});
    }
    print_window_stores(row.bytes, n, inst, step_us, rank, p);
    // the segment length each window chose for this size (the same on every rank)
    if (rank == 0 && cols[k_hier].red->window_segment_of(n)) {
      std::printf("%12.0f # window segments (KiB; 0: still choosing):", row.bytes);
      for (std::size_t k : {k_hier, k_hier_again}) {
        std::printf(" %s %zu", cols[k].name.c_str(),
                    cols[k].red->window_segment_of(n).value_or(0) * sizeof(float) / 1024);
      }
      std::printf("\n");
    }
    if (rank == 0) std::fflush(stdout);
    rows.push_back(row);
  }
  if (rank == 0) {
    std::printf("\n# summary: time / MPI_Allreduce's; best = fastest of ours; auto and model: "
                "their time over the fastest column (MPI_Allreduce included); pick/best: the "
                "column of auto's pick over the fastest; noise: the second MPI_Allreduce column "
                "over the first; hier2: the second hierarchical column (another instance, with "
                "a window of its own) over the first (on the columns' shared window); sw/re: "
                "auto's switches and re-measurements\n%10s",
                "bytes");
    for (std::size_t k = 1; k <= n_algos; ++k) std::printf(" %9.9s", cols[k].name.c_str());
    std::printf(" %9s %9s %-18s %5s %9s %9s %-18s %9s %6s %6s\n", "best", "auto", "auto picks",
                "sw/re", "auto/best", "pick/best", "model picks", "model/best", "noise", "hier2");
    double worst = 0.0, worst_pick = 0.0, worst_model = 0.0, worst_noise = 0.0, worst_inst = 0.0;
    for (const Row& r : rows) {
      std::printf("%10s", human(r.bytes).c_str());
      double best = 1e30;
      for (std::size_t k = 1; k <= n_algos; ++k) {
        std::printf(" %9.2f", r.ratio[k]);
        best = std::min(best, r.ratio[k]);
      }
      const double best_all = std::min(best, 1.0);
      const double rel = r.ratio[k_auto] / best_all, rel_model = r.ratio[k_model] / best_all;
      const double rel_pick = r.ratio[r.pick_column] / best_all;
      worst = std::max(worst, rel);
      worst_pick = std::max(worst_pick, rel_pick);
      worst_model = std::max(worst_model, rel_model);
      worst_noise = std::max(worst_noise, std::max(r.ratio[k_again], 1.0 / r.ratio[k_again]));
      const double inst = r.ratio[k_hier_again] / r.ratio[k_hier];
      worst_inst = std::max(worst_inst, std::max(inst, 1.0 / inst));
      std::printf(" %9.2f %9.2f %-18s %5s %9.2f %9.2f %-18s %9.2f %6.2f %6.2f\n", best,
                  r.ratio[k_auto], r.auto_pick.c_str(), r.auto_changes.c_str(), rel, rel_pick,
                  r.model_pick.c_str(), rel_model, r.ratio[k_again], inst);
    }
    std::printf("# auto is within %.1f%% of the fastest column at every size (model alone: "
                "%.0f%%); the same MPI_Allreduce timed twice differs by up to %.0f%%\n",
                (worst - 1.0) * 100.0, (worst_model - 1.0) * 100.0, (worst_noise - 1.0) * 100.0);
    std::printf("# auto's final pick, timed in its own column, is within %.1f%% of the fastest "
                "column at every size (the choice alone, without auto's instance and watch)\n",
                (worst_pick - 1.0) * 100.0);
    std::printf("# hierarchical with a window of its own differs from hierarchical on the columns' "
                "shared window by up to %.0f%%\n",
                (worst_inst - 1.0) * 100.0);
  }
  return 0;
}

// ---- window ----------------------------------------------------------------------------------

// Round trip of one cache line between ranks 0 and 1 of a shared-memory communicator (others
// wait): each writes the count the other waits for, n times.
double core_round_trip(MPI_Comm sh, std::atomic<int>* line, int n) {
  int r = 0;
  PT_MPI(MPI_Comm_rank(sh, &r));
  PT_MPI(MPI_Barrier(sh));
  const double t0 = MPI_Wtime();
  if (r < 2) {
    for (int i = 0; i < n; ++i) {
      const int wait = 2 * i + r, next = 2 * i + r + 1;
      while (line->load(std::memory_order_acquire) != wait) {
      }
      line->store(next, std::memory_order_release);
    }
  }
  double t = (MPI_Wtime() - t0) / n;
  PT_MPI(MPI_Barrier(sh));
  if (r == 0) line->store(0, std::memory_order_release);
  PT_MPI(MPI_Bcast(&t, 1, MPI_DOUBLE, 0, sh));
  PT_MPI(MPI_Barrier(sh));
  return t;
}

// The communicator of a mode that runs on one node: every rank, all sharing memory, 2 or more
// (else invalid_argument naming the mode); this rank's place in it and its size.
MPI_Comm one_node(const char* mode, int& rank, int& size) {
  MPI_Comm sh;
  PT_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &sh));
  int world = 1;
  PT_MPI(MPI_Comm_rank(sh, &rank));
  PT_MPI(MPI_Comm_size(sh, &size));
  PT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  if (size < 2 || size != world) {
    PT_MPI(MPI_Comm_free(&sh));
    throw std::invalid_argument(std::string(mode) + " needs 2 or more ranks, all on one node");
  }
  return sh;
}

// The shared-window step's stores (docs/collectives.md): per sample, the core-to-core round
// trip and hierarchical on one node with adaptive, cached and streaming stores against
// MPI_Allreduce, interleaved call by call; at the end the means per state of the cores.
int bench_window(const Args& a) {
  int r = 0, p = 1;
  MPI_Comm sh = one_node("window", r, p);
  const int samples = std::max(1, static_cast<int>(a.num("--samples", 60)));
  char* base = nullptr;
  MPI_Win win;
  PT_MPI(MPI_Win_allocate_shared(r == 0 ? 64 : 0, 1, MPI_INFO_NULL, sh, &base, &win));
  {
    MPI_Aint sz = 0;
    int unit = 0;
    PT_MPI(MPI_Win_shared_query(win, 0, &sz, &unit, &base));
  }
  auto* line = new (base) std::atomic<int>(0);
  PT_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win));
  PT_MPI(MPI_Win_sync(win));
  PT_MPI(MPI_Barrier(sh));
  std::vector<std::unique_ptr<pt::Allreducer>> red;
  for (int k = 0; k < 4; ++k) {
    pt::AllreduceOptions opt;
    opt.algo = k == 3 ? pt::AllreduceAlgo::mpi : pt::AllreduceAlgo::hierarchical;
    opt.node_size = p;
    opt.tune = false;
    opt.window_stores = k == 0   ? pt::WindowStores::adaptive
                        : k == 1 ? pt::WindowStores::cached
                                 : pt::WindowStores::streaming;
    red.push_back(std::make_unique<pt::Allreducer>(sh, opt));
  }
  const std::size_t sizes[] = {std::size_t{1} << 11, std::size_t{1} << 15, std::size_t{1} << 18,
                               std::size_t{1} << 20, std::size_t{1} << 22, std::size_t{1} << 24};
  const std::size_t ns = std::size(sizes);
  std::vector<double> trip(static_cast<std::size_t>(samples));
  std::vector<std::vector<double>> ratio(static_cast<std::size_t>(samples)); // [size][kind 0-2]
  if (r == 0) {
    std::printf("# pipetrain-bench window: %d ranks on one node; round trip: one cache line "
                "between ranks 0 and 1; hierarchical's time / MPI_Allreduce's, stores into the "
                "window adaptive | cached | streaming\n%7s %9s",
                p, "sample", "trip_ns");
    for (std::size_t n : sizes) std::printf(" %20s", human(static_cast<double>(n * 4)).c_str());
    std::printf("\n");
  }
  std::vector<float> buf(sizes[ns - 1]);
  for (int smp = 0; smp < samples; ++smp) {
    trip[static_cast<std::size_t>(smp)] = core_round_trip(sh, line, 5000);
    for (std::size_t n : sizes) {
      double t[4] = {0, 0, 0, 0};
      const int reps = n >= (std::size_t{1} << 22) ? 2 : n >= (std::size_t{1} << 18) ? 8 : 40;
      for (int it = 0; it < reps; ++it) {
        for (int k = 0; k < 4; ++k) {
          fill_like_gradients(buf.data(), n);
          PT_MPI(MPI_Barrier(sh));
          const double t0 = MPI_Wtime();
          red[static_cast<std::size_t>(k)]->sum(buf.data(), n);
          t[k] += MPI_Wtime() - t0;
        }
      }
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, t, 4, MPI_DOUBLE, MPI_MAX, sh));
      for (int k = 0; k < 3; ++k) ratio[static_cast<std::size_t>(smp)].push_back(t[k] / t[3]);
    }
    if (r == 0) {
      std::printf("%7d %9.0f", smp, trip[static_cast<std::size_t>(smp)] * 1e9);
      for (std::size_t i = 0; i < ns; ++i) {
        const double* x = &ratio[static_cast<std::size_t>(smp)][3 * i];
        std::printf("   %5.2f %5.2f %5.2f", x[0], x[1], x[2]);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  // two states: round trips within 2x of the fastest sample, and the rest
  const double fastest = *std::min_element(trip.begin(), trip.end());
  if (r == 0) {
    std::printf("# means per state of the cores (round trip within 2x of the fastest sample: "
                "close; else far); adaptive | cached | streaming\n");
    for (int far = 0; far < 2; ++far) {
      std::vector<double> sum(3 * ns, 0.0);
      int count = 0;
      for (int smp = 0; smp < samples; ++smp) {
        if ((trip[static_cast<std::size_t>(smp)] > 2 * fastest) != (far == 1)) continue;
        ++count;
        for (std::size_t i = 0; i < 3 * ns; ++i) sum[i] += ratio[static_cast<std::size_t>(smp)][i];
      }
      std::printf("# %-5s %3d samples", far ? "far" : "close", count);
      for (std::size_t i = 0; i < ns && count > 0; ++i) {
        std::printf("   %5.2f %5.2f %5.2f", sum[3 * i] / count, sum[3 * i + 1] / count,
                    sum[3 * i + 2] / count);
      }
      std::printf("\n");
    }
  }
  red.clear();
  PT_MPI(MPI_Win_unlock_all(win));
  PT_MPI(MPI_Win_free(&win));
  PT_MPI(MPI_Comm_free(&sh));
  return 0;
}

// ---- cma --------------------------------------------------------------------------------------

// A single-copy node all-reduce through Linux cross-memory attach (process_vm_readv), the way
// Open MPI's shared-memory transport moves large messages: a probe, not a library algorithm.
// It answers, on the machine at hand, whether reading the other ranks' buffers directly would
// beat the window step (docs/collectives.md, "Stop 24" proposed it; "Stop 25" measured it).
// Rank k owns chunk k: piece by piece it reads chunk k of every other rank's buffer into a small
// scratch and sums the ranks' pieces in rank order (the window step's operands and order) into
// its own buffer; after a barrier it reads every other chunk out of its owner's buffer into its
// own; a last barrier keeps each buffer unchanged until all have read it.
class SingleCopy {
public:
  explicit SingleCopy(MPI_Comm comm) : comm_(comm) {
    PT_MPI(MPI_Comm_rank(comm_, &rank_));
    PT_MPI(MPI_Comm_size(comm_, &size_));
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); // Yama: let the other ranks read us
    const int me = static_cast<int>(getpid());
    pid_.resize(static_cast<std::size_t>(size_));
    PT_MPI(MPI_Allgather(&me, 1, MPI_INT, pid_.data(), 1, MPI_INT, comm_));
    addr_.resize(static_cast<std::size_t>(size_));
    scratch_.resize(kPiece);
    acc_.resize(kPiece);
  }
  // "" when every rank can read every other rank's memory, else the first refusal's reason
  std::string probe() {
    const std::uint64_t mine = 0x5049504554524149; // read back by the others
    std::uint64_t at = reinterpret_cast<std::uintptr_t>(&mine);
    PT_MPI(MPI_Allgather(&at, 1, MPI_UINT64_T, addr_.data(), 1, MPI_UINT64_T, comm_));
    int failed = 0;
    std::string why;
    for (int r = 0; r < size_ && failed == 0; ++r) {
      if (r == rank_) continue;
      std::uint64_t got = 0;
      if (!read(r, &got, addr_[static_cast<std::size_t>(r)], sizeof got)) {
        why = std::strerror(errno);
      } else if (got != mine) {
        why = "read the wrong bytes";
      }
      failed = why.empty() ? 0 : 1;
    }
    int any = 0;
    PT_MPI(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm_));
    if (any != 0 && why.empty()) why = "refused on another rank";
    return any != 0 ? why : std::string();
  }
  void sum(float* buf, std::size_t n) {
    std::uint64_t at = reinterpret_cast<std::uintptr_t>(buf);
    PT_MPI(MPI_Allgather(&at, 1, MPI_UINT64_T, addr_.data(), 1, MPI_UINT64_T, comm_));
    const std::size_t b = begin(n, rank_), e = begin(n, rank_ + 1);
    for (std::size_t o = b; o < e; o += kPiece) {
      const std::size_t w = std::min(kPiece, e - o);
      float* dst = buf + o;
      // rank 0's piece first, then each other rank's added in rank order
      float* acc = rank_ == 0 ? dst : acc_.data();
      if (rank_ != 0) fetch(0, acc, o, w);
      for (int r = 1; r < size_; ++r) {
        const float* src = r == rank_ ? dst : scratch_.data();
        if (r != rank_) fetch(r, scratch_.data(), o, w);
        for (std::size_t i = 0; i < w; ++i) acc[i] += src[i];
      }
      if (acc != dst) std::memcpy(dst, acc, w * sizeof(float));
    }
    PT_MPI(MPI_Barrier(comm_));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::size_t rb = begin(n, r), re = begin(n, r + 1);
      fetch(r, buf + rb, rb, re - rb);
    }
    PT_MPI(MPI_Barrier(comm_));
  }

private:
  static constexpr std::size_t kPiece = std::size_t{1} << 14; // 64 KiB: stays in L1/L2
  std::size_t begin(std::size_t n, int k) const {
    return n * static_cast<std::size_t>(k) / static_cast<std::size_t>(size_);
  }
  bool read(int r, void* dst, std::uint64_t src, std::size_t bytes) const {
    iovec local{dst, bytes};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(src)), bytes};
    return process_vm_readv(pid_[static_cast<std::size_t>(r)], &local, 1, &remote, 1, 0) ==
           static_cast<ssize_t>(bytes);
  }
  // floats [off, off + w) of rank r's buffer into dst
  void fetch(int r, float* dst, std::size_t off, std::size_t w) const {
    const std::uint64_t src = addr_[static_cast<std::size_t>(r)] + off * sizeof(float);
    if (!read(r, dst, src, w * sizeof(float))) {
      throw std::runtime_error(std::string("process_vm_readv failed: ") + std::strerror(errno));
    }
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<int> pid_;
  std::vector<std::uint64_t> addr_;
  std::vector<float> scratch_, acc_;
};

// The window step (hierarchical on one node), the single copy and MPI_Allreduce, interleaved
// call by call at 256 KiB to --max-bytes (64 MiB): per size the median call (max over ranks)
// of each, and their ratios. The single copy's first call of each size is checked bit for bit
// against the window step's result on the same data.
int bench_cma(const Args& a) {
  int r = 0, p = 1;
  MPI_Comm sh = one_node("cma", r, p);
  SingleCopy single(sh);
  if (const std::string why = single.probe(); !why.empty()) {
    if (r == 0) {
      std::printf("# pipetrain-bench cma: process_vm_readv is refused here (%s): no single copy "
                  "on this machine (ptrace permission: Yama's ptrace_scope, or a seccomp filter)\n",
                  why.c_str());
    }
    PT_MPI(MPI_Comm_free(&sh));
    return 0;
  }
  const int calls = std::max(3, static_cast<int>(a.num("--calls", 30)));
  const auto max_floats = static_cast<std::size_t>(a.num("--max-bytes", 64 << 20) / 4);
  pt::AllreduceOptions opt;
  opt.algo = pt::AllreduceAlgo::hierarchical;
  opt.node_size = p;
  opt.tune = false;
  pt::Allreducer window(sh, opt);
  if (r == 0) {
    std::printf("# pipetrain-bench cma: %d ranks on one node; median call (max over ranks) of %d, "
                "interleaved; window: hierarchical's shared-window step; single: the single copy "
                "through process_vm_readv\n%9s %11s %11s %11s %13s %13s %15s\n",
                p, calls, "bytes", "window_us", "single_us", "mpi_us", "window/mpi", "single/mpi",
                "single/window");
  }
  std::vector<float> buf(std::max<std::size_t>(max_floats, 1)), check;
  for (std::size_t n = std::size_t{1} << 16; n <= max_floats; n *= 2) {
    std::array<std::vector<double>, 3> t;
    for (int c = -1; c < calls; ++c) { // c = -1: untimed, and the exactness check
      for (int k = 0; k < 3; ++k) {
        fill_like_gradients(buf.data(), n);
        PT_MPI(MPI_Barrier(sh));
        const double t0 = MPI_Wtime();
        if (k == 0) window.sum(buf.data(), n);
        if (k == 1) single.sum(buf.data(), n);
        if (k == 2)
          PT_MPI(
              MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, sh));
        double dt = MPI_Wtime() - t0;
        PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, sh));
        if (c >= 0) t[static_cast<std::size_t>(k)].push_back(dt);
        if (c == -1 && k == 0) check.assign(buf.begin(), buf.begin() + static_cast<long>(n));
        if (c == -1 && k == 1 && std::memcmp(check.data(), buf.data(), n * sizeof(float)) != 0) {
          throw std::runtime_error("the single copy's sum differs from the window step's at " +
                                   human(static_cast<double>(n * 4)));
        }
      }
    }
    double med[3];
    for (std::size_t k = 0; k < 3; ++k) {
      std::sort(t[k].begin(), t[k].end());
      med[k] = t[k][t[k].size() / 2];
    }
    if (r == 0) {
      std::printf("%9s %11.1f %11.1f %11.1f %13.2f %13.2f %15.2f\n",
                  human(static_cast<double>(n * 4)).c_str(), med[0] * 1e6, med[1] * 1e6,
                  med[2] * 1e6, med[0] / med[2], med[1] / med[2], med[1] / med[0]);
      std::fflush(stdout);
    }
  }
  PT_MPI(MPI_Comm_free(&sh));
  return 0;
}

// ---- instances --------------------------------------------------------------------------------

// Several instances of hierarchical on one node, each with its own window, called in turn (a
// shuffled order per pass) at a few sizes, round after round: per round and size the median call
// of each instance (max over ranks) and the kind of stores each rank ends on; at the end each
// instance's mean over the rounds, over the mean of all instances. A spread that keeps the same
// instances slow round after round belongs to their windows; one that moves is the machine's.
// --stores: adaptive, cached or streaming for every rank, or a list by rank ("cached,streaming":
// rank 0 cached, rank 1 streaming), to time a window whose ranks store differently.
// --windows shared: all instances step through one window (a pt::WindowPool); the spread that
// is left is not the windows' memory (docs/collectives.md, "Stop 23").
int bench_instances(const Args& a) {
  const int count = std::clamp(static_cast<int>(a.num("--instances", 6)), 2, 16);
  const int rounds = std::max(1, static_cast<int>(a.num("--rounds", 16)));
  // the stores of every rank in turn, all checked on every rank (so that all refuse alike)
  std::vector<pt::WindowStores> kinds;
  {
    std::string list = a.get("--stores", "adaptive") + ",";
    for (std::size_t at = 0, comma; (comma = list.find(',', at)) != std::string::npos;
         at = comma + 1) {
      const std::string kind = list.substr(at, comma - at);
      if (kind == "adaptive") {
        kinds.push_back(pt::WindowStores::adaptive);
      } else if (kind == "cached") {
        kinds.push_back(pt::WindowStores::cached);
      } else if (kind == "streaming") {
        kinds.push_back(pt::WindowStores::streaming);
      } else {
        throw std::invalid_argument("--stores takes adaptive, cached or streaming (or a list by "
                                    "rank), got \"" +
                                    kind + "\"");
      }
    }
  }
  const std::string windows = a.get("--windows", "own");
  if (windows != "own" && windows != "shared") {
    throw std::invalid_argument("--windows takes own or shared, got \"" + windows + "\"");
  }
  int r = 0, p = 1;
  MPI_Comm sh = one_node("instances", r, p);
  pt::AllreduceOptions opt;
  opt.algo = pt::AllreduceAlgo::hierarchical;
  opt.node_size = p;
  opt.tune = false;
  opt.window_stores = kinds[static_cast<std::size_t>(r) % kinds.size()];
  if (windows == "shared") opt.windows = std::make_shared<pt::WindowPool>();
  std::vector<std::unique_ptr<pt::Allreducer>> red;
  for (int k = 0; k < count; ++k) red.push_back(std::make_unique<pt::Allreducer>(sh, opt));
  const std::size_t sizes[] = {std::size_t{1} << 15, std::size_t{1} << 17, std::size_t{1} << 19,
                               std::size_t{1} << 21};
  const std::size_t ns = std::size(sizes), kc = static_cast<std::size_t>(count);
  std::vector<float> buf(sizes[ns - 1]);
  std::vector<std::size_t> order(kc);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 shuffler(20261123);
  std::vector<std::vector<double>> total(ns, std::vector<double>(kc, 0.0)); // sums over rounds
  std::vector<std::vector<double>> spread(ns); // slowest / fastest instance, per round
  std::vector<int> mixed(ns, 0); // instances whose ranks ended a round on different kinds
  if (r == 0) {
    std::printf("# pipetrain-bench instances: %d ranks on one node, %d instances of hierarchical "
                "(windows: %s), stores %s; per size: slowest/fastest instance, then each "
                "instance's median call in us (max over ranks) / the kind each rank ends on "
                "(0 cached, 1 streaming, - fixed)\n",
                p, count, windows.c_str(), a.get("--stores", "adaptive").c_str());
  }
  for (int round = 0; round < rounds; ++round) {
    if (r == 0) std::printf("round %3d", round);
    for (std::size_t si = 0; si < ns; ++si) {
      const std::size_t n = sizes[si];
      const int reps = std::max(30, static_cast<int>(300000 / n));
      std::vector<std::vector<double>> t(kc);
      for (std::size_t k = 0; k < kc; ++k) red[k]->sum(buf.data(), n); // untimed: warm
      for (int it = 0; it < reps; ++it) {
        for (std::size_t i = kc - 1; i > 0; --i) std::swap(order[i], order[shuffler() % (i + 1)]);
        for (std::size_t k : order) {
          fill_like_gradients(buf.data(), n);
          PT_MPI(MPI_Barrier(sh));
          const double t0 = MPI_Wtime();
          red[k]->sum(buf.data(), n);
          t[k].push_back(MPI_Wtime() - t0);
        }
      }
      std::vector<double> med(kc);
      std::vector<int> kind(kc * static_cast<std::size_t>(p), 0);
      for (std::size_t k = 0; k < kc; ++k) {
        std::sort(t[k].begin(), t[k].end());
        med[k] = t[k][t[k].size() / 2];
        const auto st = red[k]->window_stores_of(n);
        kind[k * static_cast<std::size_t>(p) + static_cast<std::size_t>(r)] = st ? st->kind() : 2;
      }
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, med.data(), count, MPI_DOUBLE, MPI_MAX, sh));
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, kind.data(), static_cast<int>(kind.size()), MPI_INT,
                           MPI_SUM, sh));
      for (std::size_t k = 0; k < kc; ++k) {
        total[si][k] += med[k];
        const int* kd = &kind[k * static_cast<std::size_t>(p)];
        if (std::any_of(kd, kd + p, [&](int x) { return x != kd[0]; })) ++mixed[si];
      }
      const auto [lo, hi] = std::minmax_element(med.begin(), med.end());
      spread[si].push_back(*hi / *lo);
      if (r == 0) {
        std::printf(" | %s %4.2f", human(static_cast<double>(n * 4)).c_str(), *hi / *lo);
        for (std::size_t k = 0; k < kc; ++k) {
          std::printf(" %6.0f/", med[k] * 1e6);
          for (int q = 0; q < p; ++q) {
            const int kd = kind[k * static_cast<std::size_t>(p) + static_cast<std::size_t>(q)];
            std::printf("%c", kd == 2 ? '-' : static_cast<char>('0' + kd));
          }
        }
      }
    }
    if (r == 0) {
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  if (r == 0) {
    std::printf("# slowest / fastest instance, mean and 90th percentile over the rounds; "
                "instances x rounds whose ranks ended on different kinds of stores:");
    for (std::size_t si = 0; si < ns; ++si) {
      std::vector<double>& v = spread[si];
      std::sort(v.begin(), v.end());
      std::printf(" | %s %.3f %.2f %d/%d", human(static_cast<double>(sizes[si] * 4)).c_str(),
                  std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()),
                  v[v.size() * 9 / 10], mixed[si], count * rounds);
    }
    std::printf("\n# each instance's mean over the rounds / the mean of all instances:");
    for (std::size_t si = 0; si < ns; ++si) {
      const double all = std::accumulate(total[si].begin(), total[si].end(), 0.0) / count;
      std::printf(" | %s", human(static_cast<double>(sizes[si] * 4)).c_str());
      for (std::size_t k = 0; k < kc; ++k) std::printf(" %5.3f", total[si][k] / all);
    }
    std::printf("\n");
  }
  red.clear();
  opt.windows.reset(); // the shared windows, if any, freed with their last user
  PT_MPI(MPI_Comm_free(&sh));
  return 0;
}

// ---- simulate ---------------------------------------------------------------------------------

int simulate(const Args& a) {
  const int nodes = static_cast<int>(a.num("--nodes", 0));
  if (nodes < 1) throw std::invalid_argument("simulate needs --nodes N (N >= 1)");
  const int g = std::max(1, static_cast<int>(a.num("--ranks-per-node", 1)));
  const int p = nodes * g;
  const pt::Topology topo = topology_from(a, nodes);
  const double min_bytes = std::max(4.0, a.num("--min-bytes", 8));
  const double max_bytes = a.num("--max-bytes", 256.0 * 1048576);
  std::printf("# modelled all-reduce time (us), %d nodes x %d ranks = %d ranks, topology %s\n"
              "# inter-node: alpha %.2f us, %.2f GB/s; intra-node: alpha %.2f us, %.2f GB/s, "
              "window copy %.2f GB/s; gamma %.3f ns/B\n",
              nodes, g, p, topo.name.c_str(), topo.inter.alpha * 1e6, 1e-9 / topo.inter.beta,
              topo.intra.alpha * 1e6, 1e-9 / topo.intra.beta, 1e-9 / topo.intra.copy,
              topo.intra.gamma * 1e9);
  std::printf("%10s", "bytes");
  for (pt::AllreduceAlgo al : pt::modelled_algorithms()) {
    std::printf(" %12.12s", pt::algorithm_name(al));
  }
  std::printf(" %12s  %s\n", "bw-bound", "fastest");
  for (double bytes = min_bytes; bytes <= max_bytes * 1.0000001; bytes *= 4) {
    std::printf("%10s", human(bytes).c_str());
    for (pt::AllreduceAlgo al : pt::modelled_algorithms()) {
      std::printf(" %12.1f", pt::modelled_time(al, bytes, p, g, topo) * 1e6);
    }
    std::printf(" %12.1f  %s\n", pt::bandwidth_bound(bytes, p, g, topo) * 1e6,
                pt::algorithm_name(pt::choose_algorithm(bytes, p, g, topo)));
  }
  return 0;
}

// ---- calibrate --------------------------------------------------------------------------------

// Mean seconds of an MPI_Sendrecv exchange of `bytes` each way between ranks a and b (others
// wait at the barrier): alpha + bytes * beta in the model's terms.
double exchange_time(int a, int b, std::size_t bytes, int iters) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<char> s(std::max<std::size_t>(bytes, 1)), r(s.size());
  double t = 0.0;
  const int peer = rank == a ? b : a;
  for (int it = -10; it < iters; ++it) { // ten warm-up exchanges
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank != a && rank != b) continue;
    const double t0 = MPI_Wtime();
    PT_MPI(MPI_Sendrecv(s.data(), static_cast<int>(bytes), MPI_BYTE, peer, 9, r.data(),
                        static_cast<int>(bytes), MPI_BYTE, peer, 9, MPI_COMM_WORLD,
                        MPI_STATUS_IGNORE));
    if (it >= 0) t += MPI_Wtime() - t0;
  }
  PT_MPI(MPI_Bcast(&t, 1, MPI_DOUBLE, a, MPI_COMM_WORLD));
  return t / iters;
}

// Exchange times from 8 B to 4 MiB (powers of two) between ranks a and b: alpha is the 8 B
// time, beta the slope between the two largest sizes, and the table keeps every point.
pt::LinkCost measure_link(int a, int b, double gamma, double copy) {
  pt::LinkCost l;
  for (std::size_t bytes = 8; bytes <= (std::size_t{4} << 20); bytes *= 2) {
    const int iters = bytes <= 65536 ? 300 : 30;
    l.table_bytes.push_back(static_cast<double>(bytes));
    l.table_s.push_back(exchange_time(a, b, bytes, iters));
  }
  const std::size_t k = l.table_s.size();
  l.alpha = l.table_s[0];
  l.beta = std::max(1e-13, (l.table_s[k - 1] - l.table_s[k - 2]) /
                               (l.table_bytes[k - 1] - l.table_bytes[k - 2]));
  l.gamma = gamma;
  l.copy = copy;
  return l;
}

double shared_copy_cost(std::size_t bytes, float* a, const float* b) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm sh;
  PT_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &sh));
  int sh_rank = 0, sh_size = 1;
  PT_MPI(MPI_Comm_rank(sh, &sh_rank));
  PT_MPI(MPI_Comm_size(sh, &sh_size));
  double copy = 0.0;
  const int reps = 30;
  if (sh_size >= 2) {
    char* base = nullptr;
    MPI_Win win;
    PT_MPI(MPI_Win_allocate_shared(sh_rank == 0 ? static_cast<MPI_Aint>(bytes) : 0, 1,
                                   MPI_INFO_NULL, sh, &base, &win));
    MPI_Aint sz = 0;
    int unit = 0;
    char* shared = nullptr;
    PT_MPI(MPI_Win_shared_query(win, 0, &sz, &unit, &shared));
    PT_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win));
    auto sync = [&] {
      PT_MPI(MPI_Win_sync(win));
      PT_MPI(MPI_Barrier(sh));
      PT_MPI(MPI_Win_sync(win));
    };
    double barrier = 0.0;
    for (int r = -2; r < reps; ++r) {
      const double t0 = MPI_Wtime();
      sync();
      sync();
      if (r >= 0) barrier += MPI_Wtime() - t0;
    }
    double t = 0.0;
    for (int r = -2; r < reps; ++r) {
      const double t0 = MPI_Wtime();
      if (sh_rank == 0) std::memcpy(shared, b, bytes);
      sync();
      if (sh_rank == 1) std::memcpy(a, shared, bytes);
      sync();
      if (r >= 0) t += MPI_Wtime() - t0;
    }
    copy = std::max(1e-13, (t - barrier) / reps / (2.0 * static_cast<double>(bytes)));
    PT_MPI(MPI_Win_unlock_all(win));
    PT_MPI(MPI_Win_free(&win));
  } else {
    const double t0 = MPI_Wtime();
    for (int r = 0; r < reps; ++r) std::memcpy(a, b, bytes);
    copy = (MPI_Wtime() - t0) / reps / static_cast<double>(bytes);
  }
  PT_MPI(MPI_Comm_free(&sh));
  PT_MPI(MPI_Bcast(&copy, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  return copy;
}

// hierarchical's node-local step through the shared window, timed on every node at once
// (nodes of g consecutive ranks), 8 B to 16 MiB: the model interpolates these times
void measure_window(int g, pt::LinkCost& l) {
  pt::AllreduceOptions opt;
  opt.algo = pt::AllreduceAlgo::hierarchical;
  opt.node_size = g;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm node;
  PT_MPI(MPI_Comm_split(MPI_COMM_WORLD, rank / g, rank, &node));
  {
    pt::Allreducer red(node, opt);
    std::vector<float> buf;
    for (std::size_t bytes = 8; bytes <= (std::size_t{16} << 20); bytes *= 4) {
      const std::size_t n = bytes / sizeof(float);
      buf.assign(n, 0.0f);
      const int iters = bytes <= 65536 ? 300 : 20;
      double t = 0.0;
      for (int it = -5; it < iters; ++it) {
        PT_MPI(MPI_Barrier(MPI_COMM_WORLD));
        const double t0 = MPI_Wtime();
        red.sum(buf.data(), n);
        if (it >= 0) t += MPI_Wtime() - t0;
      }
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
      l.window_bytes.push_back(static_cast<double>(bytes));
      l.window_s.push_back(t / iters);
    }
  }
  PT_MPI(MPI_Comm_free(&node));
}

int calibrate(const Args& a) {
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  if (p < 2) throw std::invalid_argument("calibrate needs at least 2 ranks (mpirun -np 2 ...)");
  const int g = ranks_per_node(a, MPI_COMM_WORLD);
  const std::string out = a.get("--out", "calibration.toml");

  // gamma: acc += x over 4 MiB, the all-reduce algorithms' reduction, mean over ranks
  const std::size_t n = std::size_t{1} << 20;
  std::vector<float> acc(n, 0.0f), x(n, 1.0f);
  double gamma = 0.0;
  {
    const int reps = 50;
    const double t0 = MPI_Wtime();
    for (int r = 0; r < reps; ++r) {
      for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
    }
    gamma = (MPI_Wtime() - t0) / reps / static_cast<double>(n * sizeof(float));
    volatile float sink = acc[n / 2];
    (void)sink;
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &gamma, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    gamma /= p;
  }
  // copy: 4 MiB through a shared window between ranks 0 and 1 when they share a node (rank 0
  // copies in, rank 1 copies out, as the hierarchical node-local step does), else a memcpy
  double copy = shared_copy_cost(n * sizeof(float), acc.data(), x.data());
  pt::Topology t = pt::topology_preset(p > g ? "fat-tree" : "node");
  if (a.get("--topology", "") != "") t = pt::topology_preset(a.get("--topology", ""));
  t.name = out;
  // inside a node: rank 0 and rank 1 (consecutive ranks share a node when g > 1)
  if (g > 1) {
    t.intra = measure_link(0, 1, gamma, copy);
    measure_window(g, t.intra);
  }
  // across nodes: rank 0 and the first rank of the next node
  if (p > g) {
    t.inter = measure_link(0, g, gamma, copy);
  } else {
    t.inter.gamma = gamma;
    t.inter.copy = copy;
    t.inter_measured = false;
  }
  if (g == 1) t.intra = t.inter; // no two ranks share a node: one level
  if (rank == 0) {
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M", std::localtime(&now));
    std::string header = std::string("written by pipetrain-bench calibrate, ") + stamp + ", " +
                         std::to_string(p) + " ranks, " + std::to_string(g) + " per node\n" +
                         "exchange times of MPI_Sendrecv from 8 B to 4 MiB (alpha: 8 B; bandwidth: "
                         "slope of the two largest), gamma: float32 sums over 4 MiB, copy: 4 MiB "
                         "through a shared window\nuse it with comm.calibration = \"" +
                         out + "\" (and comm.topology = \"auto\")";
    if (!t.inter_measured) {
      header += "\n[inter] was not measured (one node): it keeps the fat-tree defaults";
    }
    const std::filesystem::path parent = std::filesystem::path(out).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::ofstream f(out);
    f << pt::calibration_toml(t, header);
    if (!f) throw std::runtime_error("cannot write " + out);
    std::printf("intra-node: alpha %.2f us, %.2f GB/s; inter-node: alpha %.2f us, %.2f GB/s%s; "
                "gamma %.3f ns/byte, copy %.3f ns/byte\nwrote %s\n",
                t.intra.alpha * 1e6, 1e-9 / t.intra.beta, t.inter.alpha * 1e6, 1e-9 / t.inter.beta,
                t.inter_measured ? "" : " (default, not measured)", gamma * 1e9, copy * 1e9,
                out.c_str());
  }
  return 0;
}

int usage() {
  std::fprintf(
      stderr, "usage: pipetrain-bench allreduce|simulate|calibrate|window|instances|cma [options]\n"
              "  mpirun -np P pipetrain-bench allreduce [--min-bytes B] [--max-bytes B] "
              "[--seconds S] [--ranks-per-node N] [--topology T | --calibration F]\n"
              "  pipetrain-bench simulate --nodes N [--ranks-per-node G] "
              "[--topology flat|fat-tree|tianhe | --calibration F]\n"
              "  mpirun -np P pipetrain-bench calibrate [--out FILE] [--ranks-per-node N]\n"
              "  mpirun -np P pipetrain-bench window [--samples N]   (one node)\n"
              "  mpirun -np P pipetrain-bench instances [--instances K] [--rounds R] "
              "[--stores adaptive|cached|streaming|KIND,KIND,...]   (one node)\n"
              "  mpirun -np P pipetrain-bench cma [--calls N] [--max-bytes B]   (one node)\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  Args a;
  for (int i = 2; i < argc; ++i) a.rest.emplace_back(argv[i]);
  try {
    if (cmd == "simulate") return simulate(a); // a model: no MPI needed
    if (cmd != "allreduce" && cmd != "calibrate" && cmd != "window" && cmd != "instances" &&
        cmd != "cma") {
      return usage();
    }
    MPI_Init(&argc, &argv);
    const int code = cmd == "allreduce"   ? bench_allreduce(a)
                     : cmd == "window"    ? bench_window(a)
                     : cmd == "instances" ? bench_instances(a)
                     : cmd == "cma"       ? bench_cma(a)
                                          : calibrate(a);
    MPI_Finalize();
    return code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipetrain-bench %s: %s\n", cmd.c_str(), e.what());
    int init = 0;
    MPI_Initialized(&init);
    if (init) MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
}
