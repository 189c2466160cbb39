// pipetrain-bench: the all-reduce benchmark and the all-reduce cost model (docs/collectives.md).
//   mpirun -np P build/pipetrain-bench allreduce [--min-bytes 8] [--max-bytes 268435456]
//          [--ranks-per-node N] [--topology T | --calibration FILE] [--seconds 0.1]
//   build/pipetrain-bench simulate --nodes N [--ranks-per-node G] [--topology T | --calibration F]
//   mpirun -np P build/pipetrain-bench calibrate [--out calibration.toml] [--ranks-per-node N]
#include <cstdio>
#include <cstdlib>
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
               "usage: pipetrain-bench allreduce|simulate|calibrate [options]\n"
               "  mpirun -np P pipetrain-bench allreduce [--min-bytes B] [--max-bytes B] "
               "[--seconds S] [--ranks-per-node N] [--topology T | --calibration F]\n"
               "  pipetrain-bench simulate --nodes N [--ranks-per-node G] "
               "[--topology flat|fat-tree|tianhe | --calibration F]\n"
               "  mpirun -np P pipetrain-bench calibrate [--out FILE] [--ranks-per-node N]\n");
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
    if (cmd != "allreduce" && cmd != "calibrate") return usage();
    MPI_Init(&argc, &argv);
    const int code = cmd == "allreduce" ? bench::bench_allreduce(a) : bench::calibrate(a);
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
