// Every all-reduce algorithm against MPI_Allreduce on integer-valued float data (exact in any
// summation order), counts 0, 1, p-1, odd, large and longer than the shared window, in place;
// hierarchical with emulated node sizes (node-local step through the MPI-3 shared window and
// through messages), and auto: exact on every call while it measures and afterwards while it
// challenges its pick, settled within a bounded number of calls, with the same pick on every rank.
// Prints "N passed, 0 failed" on rank 0; exit code 1 on any mismatch.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/allreduce.hpp"

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
  const char* names[] = {"mpi",     "ring", "recursive-doubling", "rabenseifner", "hierarchical",
                         "torus2d", "auto"};
  // 600011: more than two segments of the shared window, the last one short
  const std::size_t counts[] = {0, 1, static_cast<std::size_t>(size - 1), 7, 1000, 100003, 600011};
  int passed = 0, failed = 0, shm_runs = 0;
  for (const char* name : names) {
    const bool hier = std::strcmp(name, "hierarchical") == 0;
    // hierarchical: emulated nodes of 1, 2, 4 ranks and one node of all ranks, with the
    // node-local step through the shared window (stores adaptive, cached, streaming: shm 1-3)
    // and through point-to-point messages (shm 0)
    for (int node : {0, 1, 2, 4, size}) {
      for (int shm = 3; shm >= 0; --shm) {
        if (!hier && (node != 0 || shm != 1)) continue;
        pt::AllreduceOptions opt;
        opt.algo = pt::parse_allreduce(name);
        opt.node_size = node;
        opt.shared_memory = shm >= 1;
        opt.window_stores = shm == 3   ? pt::WindowStores::streaming
                            : shm == 2 ? pt::WindowStores::cached
                                       : pt::WindowStores::adaptive;
        opt.topology = pt::topology_preset("fat-tree");
        pt::Allreducer red(MPI_COMM_WORLD, opt); // kept across counts, as the trainer does
        for (std::size_t n : counts) {
          int ok = exact_sum(red, MPI_COMM_WORLD, n, 0) ? 1 : 0;
          MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
          if (ok) {
            ++passed;
          } else {
            ++failed;
            if (rank == 0) {
              std::printf("FAIL: %s node %d shm %d n %zu on %d ranks\n", name, node, shm, n, size);
            }
          }
        }
        // every node of more than one rank shares memory here: the window must have been used
        const int g = std::min(node, size); // more ranks per node than ranks: one node
        const bool expect_shm = hier && shm >= 1 && g > 1 && size % g == 0;
        if (red.used_shared_memory() != expect_shm) {
          ++failed;
          if (rank == 0) {
            std::printf("FAIL: %s node %d shm %d: shared window %s\n", name, node, shm,
                        red.used_shared_memory() ? "used" : "not used");
          }
        }
        shm_runs += red.used_shared_memory() ? 1 : 0;
      }
    }
  }
  // auto's measurement and watch: 300 calls per size, each checked, then on until a
  // re-measurement in progress (the watch saw the costs change) has settled
  // 6 candidates at most, up to 10 rounds of two calls each (the first untimed), and up to 7
  // more untimed calls of the window step while its store chooser times both kinds of stores
  constexpr int kSettleBound = 6 * 2 * 10 + 7;
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
    pt::AllreduceOptions opt;
    opt.node_size = size % 2 == 0 ? 2 : 0;
    opt.topology = pt::topology_preset("node");
    pt::Allreducer red(MPI_COMM_WORLD, opt);
    int settled_at = -1, bad_calls = 0;
    for (int call = 0; call < 300 || (!red.settled(n) && call < 300 + kSettleBound); ++call) {
      bad_calls += exact_sum(red, MPI_COMM_WORLD, n, call) ? 0 : 1;
      if (settled_at < 0 && red.settled(n)) settled_at = call;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad_calls, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const bool in_time = settled_at >= 0 && settled_at < kSettleBound;
    const auto it = red.tuned().find(n);
    int pick = it == red.tuned().end() ? -1 : static_cast<int>(it->second.pick);
    int lo = pick, hi = pick;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    bool measured = false; // the pick is a measured candidate
    if (it != red.tuned().end()) {
      for (const auto& [algo, sec] : it->second.seconds) {
        measured = measured || (static_cast<int>(algo) == pick && sec > 0.0);
      }
    }
    // one rank: nothing to measure, settled from the start
    const bool alone_ok = size == 1 && settled_at == 0 && pick < 0;
    if (bad_calls == 0 && (alone_ok || (in_time && lo == hi && pick >= 0 && measured))) {
      ++passed;
    } else {
      ++failed;
      if (rank == 0) {
        std::printf("FAIL: auto n %zu: %d inexact calls, settled at call %d, picks %d..%d%s\n", n,
                    bad_calls, settled_at, lo, hi, measured ? "" : ", pick not measured");
      }
    }
    if (rank == 0 && pick >= 0) {
      std::printf("auto n %zu: settled at call %d, picks %s, %d switch(es), %d "
                  "re-measurement(s)\n",
                  n, settled_at, pt::algorithm_name(it->second.pick), it->second.switches,
                  it->second.remeasures);
    }
  }
  // Allreducers sharing one WindowPool, called in turn with growing and shrinking sizes (one
  // regrows the window under the others): exact on every call; one window per node group,
  // shared by the users whose rows are the same ranks in the same order, and what one user's
  // steps teach the store chooser the other users see; a row of the same ranks in another
  // order (a reversed communicator) gets a window of its own; torus2d gets none.
  std::vector<int> pooled_nodes; // one node of all ranks, and nodes of two where that differs
  if (size >= 2) pooled_nodes.push_back(size);
  if (size > 2 && size % 2 == 0) pooled_nodes.push_back(2);
  for (int node : pooled_nodes) {
    auto pool = std::make_shared<pt::WindowPool>();
    MPI_Comm reversed;
    MPI_Comm_split(MPI_COMM_WORLD, 0, size - rank, &reversed);
    auto make = [&](MPI_Comm comm, const char* algo, pt::WindowStores stores) {
      pt::AllreduceOptions opt;
      opt.algo = pt::parse_allreduce(algo);
      opt.node_size = node;
      opt.window_stores = stores;
      opt.windows = pool;
      opt.topology = pt::topology_preset("node");
      return std::make_unique<pt::Allreducer>(comm, opt);
    };
    {
      auto a = make(MPI_COMM_WORLD, "hierarchical", pt::WindowStores::adaptive);
      auto b = make(MPI_COMM_WORLD, "hierarchical", pt::WindowStores::cached);
      auto c = make(MPI_COMM_WORLD, "auto", pt::WindowStores::adaptive);
      auto d = make(reversed, "hierarchical", pt::WindowStores::streaming);
      int bad = 0, call = 0;
      auto check = [&](pt::Allreducer& red, MPI_Comm comm, std::size_t n) {
        bad += exact_sum(red, comm, n, call++) ? 0 : 1;
      };
      auto e = make(MPI_COMM_WORLD, "hierarchical", pt::WindowStores::adaptive);
      check(*e, MPI_COMM_WORLD, 1000); // e's groups and window first, at a small size
      for (int i = 0; i < 5; ++i) check(*a, MPI_COMM_WORLD, 100003);
      const auto seen = e->window_stores_of(100003); // a's segments, in the shared chooser
      const bool shared_chooser = seen && seen->segments_timed() >= 4;
      const std::size_t windows_before_d = pool->windows();
      for (std::size_t n : {std::size_t{600011}, std::size_t{7}, std::size_t{100003},
                            std::size_t{1000}, std::size_t{600011}}) {
        check(*b, MPI_COMM_WORLD, n); // b regrows the window under a and c
        check(*a, MPI_COMM_WORLD, n);
        check(*d, reversed, n);
        check(*c, MPI_COMM_WORLD, n);
      }
      // torus2d's rows (of another size than the nodes where p = 4, 8) share memory but never
      // step through a window: no window of their own in the pool
      auto t = make(MPI_COMM_WORLD, "torus2d", pt::WindowStores::adaptive);
      check(*t, MPI_COMM_WORLD, 100003);
      MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      const bool ok = bad == 0 && shared_chooser && windows_before_d == 1 && pool->windows() == 2 &&
                      a->used_shared_memory() && b->used_shared_memory() && d->used_shared_memory();
      ok ? ++passed : ++failed;
      if (!ok && rank == 0) {
        std::printf("FAIL: shared window pool, node %d: %d inexact call(s), chooser %s, windows "
                    "%zu then %zu (want 1, 2)\n",
                    node, bad, shared_chooser ? "shared" : "not shared", windows_before_d,
                    pool->windows());
      }
    }
    pool.reset(); // the last user gone: the windows are freed here, before the communicator
    MPI_Comm_free(&reversed);
  }
  // the window step's segment length: chosen from whole calls of both lengths, exact on every
  // call meanwhile, the same pick on every rank (every node's window too: the step between
  // nodes exchanges chunks of the segments); none for messages of one short segment
  for (int node : pooled_nodes) {
    pt::AllreduceOptions opt;
    opt.algo = pt::AllreduceAlgo::hierarchical;
    opt.node_size = node;
    opt.topology = pt::topology_preset("node");
    pt::Allreducer red(MPI_COMM_WORLD, opt);
    const std::size_t n = 3 * pt::SegmentChooser::kShort + 5; // 3 short segments and a bit
    int bad = 0;
    std::size_t before = 1; // the pick before the last call that can complete the choice
    const int calls = 1 + 2 * pt::SegmentChooser::kCalls; // the first runs cold: not learned
    for (int call = 0; call < calls; ++call) {
      if (call == calls - 1) before = red.window_segment_of(n).value_or(1);
      bad += exact_sum(red, MPI_COMM_WORLD, n, call) ? 0 : 1;
    }
    bad += exact_sum(red, MPI_COMM_WORLD, pt::SegmentChooser::kShort, 0) ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const long pick = static_cast<long>(red.window_segment_of(n).value_or(1));
    long lo = pick, hi = pick;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    const bool picked = pick == static_cast<long>(pt::SegmentChooser::kLong) ||
                        pick == static_cast<long>(pt::SegmentChooser::kShort);
    const bool ok = bad == 0 && before == 0 && picked && lo == hi &&
                    !red.window_segment_of(pt::SegmentChooser::kShort).has_value();
    ok ? ++passed : ++failed;
    if (rank == 0) {
      std::printf("%s: window segments for %zu floats, nodes of %d: %d inexact call(s), pick "
                  "%ld..%ld floats (before the last call: %zu)\n",
                  ok ? "ok" : "FAIL", n, node, bad, lo, hi, before);
    }
  }
  // comm.autotune = false: the model decides, nothing is measured
  {
    pt::AllreduceOptions opt;
    opt.tune = false;
    opt.topology = pt::topology_preset("node");
    pt::Allreducer red(MPI_COMM_WORLD, opt);
    std::vector<float> v(1000, 1.0f);
    red.sum(v.data(), v.size());
    const bool ok = red.settled(v.size()) && red.tuned().empty() && v[0] == size &&
                    red.algorithm_for(v.size()) ==
                        pt::choose_algorithm(4000.0, size, 0, pt::topology_preset("node"));
    ok ? ++passed : ++failed;
    if (!ok && rank == 0) std::printf("FAIL: auto without tuning\n");
  }
  if (rank == 0) std::printf("%d configurations used the shared-memory window\n", shm_runs);
  if (rank == 0) std::printf("%d passed, %d failed\n", passed, failed);
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
