// pipetrain-bench calibrate: measures alpha, beta (MPI_Sendrecv exchanges) inside a node and
// between nodes, gamma (float32 sums) and the shared-window copy, and writes the TOML that
// comm.calibration reads.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/topology.hpp"
#include "common.hpp"
#include "util/errors.hpp"

namespace bench {
namespace {

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

// alpha: the time of an 8 B exchange between ranks a and b; beta: the slope between 2 and 4 MiB.
pt::LinkCost measure_link(int a, int b, double gamma, double copy) {
  pt::LinkCost l;
  l.alpha = exchange_time(a, b, 8, 300);
  const double t2 = exchange_time(a, b, std::size_t{2} << 20, 30);
  const double t4 = exchange_time(a, b, std::size_t{4} << 20, 30);
  l.beta = std::max(1e-13, (t4 - t2) / static_cast<double>(std::size_t{2} << 20));
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

} // namespace

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
  if (g > 1) t.intra = measure_link(0, 1, gamma, copy);
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
                         "MPI_Sendrecv exchanges (alpha: 8 B; bandwidth: the slope from 2 to "
                         "4 MiB), gamma: float32 sums over 4 MiB, copy: 4 MiB "
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

} // namespace bench
