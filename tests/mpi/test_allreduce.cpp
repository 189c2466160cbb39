// Every all-reduce algorithm against MPI_Allreduce on integer-valued float data (exact in any
// summation order), counts 0, 1, p-1, odd, large and longer than the shared window, in place;
// hierarchical with emulated node sizes (node-local step through the MPI-3 shared window and
// through messages), each also under a hang watchdog; and auto: exact on the call that measures
// and afterwards, one measurement per size, the same pick on every rank, none without autotune.
// Prints "N passed, 0 failed" on rank 0; exit code 1 on any mismatch. Argument: the ranks per
// real host, in blocks of consecutive ranks (default: all on one host; the two-host test gives 2).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/watchdog.hpp"

namespace {

// One call of `red` on n integer-valued floats (rank- and salt-dependent, so that calls differ)
// against MPI_Allreduce on the same data: true when this rank's result matches bit for bit.
bool exact_sum(pt::Allreducer& red, MPI_Comm comm, std::size_t n, int salt) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  std::vector<float> want(n), got(n);
  for (std::size_t i = 0; i < n; ++i) {
    want[i] = got[i] = static_cast<float>((r * 31 + salt * 7 + static_cast<int>(i % 97)) % 1000);
  }
  if (n > 0) {
    MPI_Allreduce(MPI_IN_PLACE, want.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm);
  }
  red.sum(got.data(), n);
  return std::memcmp(want.data(), got.data(), n * sizeof(float)) == 0;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int per_host = argc > 1 ? std::atoi(argv[1]) : size;
  const char* names[] = {"mpi",     "ring", "recursive-doubling", "rabenseifner", "hierarchical",
                         "torus2d", "auto"};
  // 600011: more than two segments of the shared window, the last one short
  const std::size_t counts[] = {0, 1, static_cast<std::size_t>(size - 1), 7, 1000, 100003, 600011};
  const pt::Watchdog watchdog(60.0, rank);
  int passed = 0, failed = 0, shm_runs = 0;
  auto verdict = [&](bool ok, const char* what) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_CXX_BOOL, MPI_LAND, MPI_COMM_WORLD);
    ok ? ++passed : ++failed;
    if (!ok && rank == 0) std::printf("FAIL: %s on %d ranks\n", what, size);
  };
  for (const char* name : names) {
    const bool hier = std::strcmp(name, "hierarchical") == 0;
    // hierarchical: emulated nodes of 1, 2, 4 ranks and one node of all ranks, with the
    // node-local step through the shared window (shm 1) and through messages (shm 0); every
    // algorithm also with its waits under the hang watchdog (wd 1)
    for (int node : {0, 1, 2, 4, size}) {
      for (int shm = 1; shm >= 0; --shm) {
        for (int wd = 0; wd < 2; ++wd) {
          if (!hier && (node != 0 || shm != 1)) continue;
          pt::AllreduceOptions opt;
          opt.algo = pt::parse_allreduce(name);
          opt.node_size = node;
          opt.shared_memory = shm == 1;
          opt.topology = pt::topology_preset("fat-tree");
          opt.watchdog = wd == 1 ? &watchdog : &pt::Watchdog::none();
          pt::Allreducer red(MPI_COMM_WORLD, opt); // kept across counts, as the trainer does
          for (std::size_t n : counts) {
            char what[160];
            std::snprintf(what, sizeof what, "%s node %d shm %d watchdog %d n %zu", name, node, shm,
                          wd, n);
            verdict(exact_sum(red, MPI_COMM_WORLD, n, 0), what);
          }
          // every emulated node of more than one rank inside one host shares memory: the window
          // must have been used there, and only there
          const int g = std::min(node, size); // more ranks per node than ranks: one node
          const bool expect_shm =
              hier && shm == 1 && g > 1 && size % g == 0 && g <= per_host && per_host % g == 0;
          char what[160];
          std::snprintf(what, sizeof what, "%s node %d shm %d: shared window %s", name, node, shm,
                        red.used_shared_memory() ? "used" : "not used");
          verdict(red.used_shared_memory() == expect_shm, what);
          shm_runs += red.used_shared_memory() ? 1 : 0;
        }
      }
    }
  }
  // auto: the first call of a size measures every candidate on copies and sums the bucket
  // itself once with its pick; later calls run the pick. Exact on every call, one measurement
  // per size, the same pick on every rank, a measured candidate.
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
    pt::AllreduceOptions opt;
    opt.node_size = size % 2 == 0 ? 2 : 0;
    opt.topology = pt::topology_preset("node");
    pt::Allreducer red(MPI_COMM_WORLD, opt);
    bool exact = true;
    for (int call = 0; call < 5; ++call) exact = exact_sum(red, MPI_COMM_WORLD, n, call) && exact;
    const auto it = red.measured().find(n);
    int pick = it == red.measured().end() ? -1 : static_cast<int>(it->second.pick);
    int lo = pick, hi = pick;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    bool measured = false; // the pick is a measured candidate
    if (it != red.measured().end()) {
      for (const auto& [algo, sec] : it->second.seconds) {
        measured = measured || (static_cast<int>(algo) == pick && sec > 0.0 && sec < 1e30);
      }
    }
    // one rank: nothing to measure
    const bool alone_ok = size == 1 && pick < 0 && red.measured().empty();
    const bool many_ok = size > 1 && red.measured().size() == 1 && lo == hi && measured &&
                         static_cast<int>(red.algorithm_for(n)) == pick;
    char what[96];
    std::snprintf(what, sizeof what, "auto n %zu: exact %d, picks %d..%d, measured %d", n,
                  exact ? 1 : 0, lo, hi, measured ? 1 : 0);
    verdict(exact && (alone_ok || many_ok), what);
    if (rank == 0 && pick >= 0) {
      std::printf("auto n %zu: picks %s (model: %s)\n", n, pt::algorithm_name(it->second.pick),
                  pt::algorithm_name(it->second.model));
    }
  }
  // comm.autotune = false (and runtime.deterministic): the model decides, nothing is measured
  {
    pt::AllreduceOptions opt;
    opt.autotune = false;
    opt.topology = pt::topology_preset("node");
    pt::Allreducer red(MPI_COMM_WORLD, opt);
    std::vector<float> v(1000, 1.0f);
    red.sum(v.data(), v.size());
    const bool ok = red.measured().empty() && v[0] == static_cast<float>(size) &&
                    red.algorithm_for(v.size()) ==
                        pt::choose_algorithm(4000.0, size, 0, pt::topology_preset("node"));
    verdict(ok, "auto without autotune");
  }
  if (rank == 0) std::printf("%d configurations used the shared-memory window\n", shm_runs);
  if (rank == 0) std::printf("%d passed, %d failed\n", passed, failed);
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
