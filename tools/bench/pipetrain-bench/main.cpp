// pipetrain-bench: the all-reduce and all-to-all benchmarks and the all-reduce cost model
// (docs/collectives.md).
//   mpirun -np P build/pipetrain-bench allreduce [--min-bytes 8] [--max-bytes 268435456]
//          [--ranks-per-node N] [--topology T | --calibration FILE] [--seconds 0.1]
//   mpirun -np P build/pipetrain-bench alltoall [--min-bytes 8] [--max-bytes 16777216]
//          [--ranks-per-node N] [--topology T | --calibration FILE] [--seconds 0.1]
//   build/pipetrain-bench simulate --nodes N [--ranks-per-node G] [--topology T | --calibration F]
//   mpirun -np P build/pipetrain-bench calibrate [--out calibration.toml] [--ranks-per-node N]
//   build/pipetrain-bench gemm [--sizes 256,512,1024,2048] [--seconds 0.2]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <stdexcept>

#include "common.hpp"
#include "util/errors.hpp"

namespace bench {

std::string Args::get(const std::string& flag, const std::string& fallback) const {
  for (std::size_t i = 0; i + 1 < rest.size(); ++i) {
    if (rest[i] == flag) return rest[i + 1];
  }
  return fallback;
}

double Args::num(const std::string& flag, double fallback) const {
  const std::string v = get(flag, "");
  if (v.empty()) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !(x >= 0)) {
    throw std::invalid_argument(flag + " wants a non-negative number, got \"" + v + "\"");
  }
  return x;
}

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

std::vector<double> time_rounds(std::size_t cols,
                                const std::function<double(std::size_t)>& time_call, double seconds,
                                std::mt19937& shuffler) {
  double est = 0.0;
  for (int round = 0; round < 2; ++round) {
    est = 0.0;
    for (std::size_t k = 0; k < cols; ++k) est += time_call(k) / static_cast<double>(cols);
  }
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &est, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  const int iters = std::clamp(static_cast<int>(seconds / std::max(est, 1e-7)), 30, 5000);
  std::vector<std::vector<double>> calls(cols);
  std::vector<std::size_t> order(cols);
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (int it = 0; it < iters; ++it) {
    // a draw that does not depend on the standard library's distributions
    for (std::size_t i = cols - 1; i > 0; --i) std::swap(order[i], order[shuffler() % (i + 1)]);
    for (std::size_t k : order) calls[k].push_back(time_call(k));
  }
  std::vector<double> t90(cols);
  for (std::size_t k = 0; k < cols; ++k) { // the mean of the fastest 90% of the calls
    std::vector<double>& c = calls[k];
    std::sort(c.begin(), c.end());
    c.resize(std::max<std::size_t>(1, c.size() - c.size() / 10));
    t90[k] = std::accumulate(c.begin(), c.end(), 0.0) / static_cast<double>(c.size());
  }
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, t90.data(), static_cast<int>(cols), MPI_DOUBLE, MPI_MAX,
                       MPI_COMM_WORLD));
  return t90;
}

pt::Topology topology_from(const Args& a, int nodes) {
  return pt::resolve_topology(a.get("--topology", "auto"), a.get("--calibration", ""), nodes);
}

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

} // namespace bench

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: pipetrain-bench allreduce|alltoall|simulate|calibrate|gemm [options]\n"
               "  mpirun -np P pipetrain-bench allreduce|alltoall [--min-bytes B] [--max-bytes B] "
               "[--seconds S] [--ranks-per-node N] [--topology T | --calibration F]\n"
               "  pipetrain-bench simulate --nodes N [--ranks-per-node G] "
               "[--topology flat|fat-tree|tianhe | --calibration F]\n"
               "  mpirun -np P pipetrain-bench calibrate [--out FILE] [--ranks-per-node N]\n"
               "  pipetrain-bench gemm [--sizes 256,512,1024,2048] [--seconds S]\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  bench::Args a;
  for (int i = 2; i < argc; ++i) a.rest.emplace_back(argv[i]);
  try {
    if (cmd == "simulate") return bench::simulate(a); // a model: no MPI needed
    if (cmd == "gemm") return bench::bench_gemm(a);
    if (cmd != "allreduce" && cmd != "alltoall" && cmd != "calibrate") return usage();
    MPI_Init(&argc, &argv);
    const int code = cmd == "allreduce"  ? bench::bench_allreduce(a)
                     : cmd == "alltoall" ? bench::bench_alltoall(a)
                                         : bench::calibrate(a);
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
