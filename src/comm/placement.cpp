#include "comm/placement.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "util/errors.hpp"

namespace pt {
namespace {

std::vector<int> cpus_of(const cpu_set_t& mask) {
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  }
  return cpus;
}

// OMP_NUM_THREADS's first level ("8" or "8,2"); 0 where unset or not a positive number.
int omp_num_threads() {
  const char* s = std::getenv("OMP_NUM_THREADS");
  if (s == nullptr) return 0;
  char* end = nullptr;
  const long n = std::strtol(s, &end, 10);
  return end != s && n > 0 && n <= 1024 ? static_cast<int>(n) : 0;
}

bool has_env(const char* name) {
  return std::getenv(name) != nullptr;
}

constexpr int kCoresChars = 48; // a mask's text in the table; longer ones end in "..."

} // namespace

std::string cpu_ranges(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::string binding_fix(int n) {
  const std::string N = std::to_string(n);
  const std::string ompi = "mpirun --map-by slot:PE=" + N + " (Open MPI; or --bind-to none)";
  const std::string slurm = "srun --cpus-per-task=" + N + " --cpu-bind=cores (Slurm)";
  const std::string mpich = "mpiexec -bind-to core:" + N + " (MPICH)";
  if (has_env("SLURM_STEP_ID") && has_env("SLURM_PROCID")) return slurm;
  if (has_env("OMPI_COMM_WORLD_SIZE")) return ompi;
  if (has_env("PMI_RANK") || has_env("HYDRA_CONTROL_FD")) return mpich;
  return ompi + ", " + slurm + " or " + mpich;
}

Placement place_threads(MPI_Comm world, int requested, bool threaded) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &mask); // unknown: any CPU
  }
  const std::vector<int> mine = cpus_of(mask);
  const int cpus = std::max(1, static_cast<int>(mine.size()));
  // the ranks of this machine whose masks overlap this one's share its cores
  MPI_Comm node = MPI_COMM_NULL;
  PT_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int on_node = 1;
  PT_MPI(MPI_Comm_size(node, &on_node));
  std::vector<cpu_set_t> masks(static_cast<std::size_t>(on_node));
  PT_MPI(MPI_Allgather(&mask, sizeof mask, MPI_BYTE, masks.data(), sizeof mask, MPI_BYTE, node));
  std::vector<bool> overlaps(masks.size());
  int sharing = 0;
  for (std::size_t r = 0; r < masks.size(); ++r) {
    cpu_set_t both;
    CPU_AND(&both, &mask, &masks[r]);
    overlaps[r] = CPU_COUNT(&both) > 0;
    sharing += overlaps[r] ? 1 : 0;
  }
  Placement p;
  const int env = omp_num_threads();
  p.threads = requested > 0 ? requested : env > 0 ? env : std::max(1, cpus / std::max(1, sharing));
  const bool asked = requested > 1 || (requested == 0 && env > 1);
  if (!threaded) p.threads = 1;
  // threads that will run on this rank's cores: its own and those of the ranks sharing them
  std::vector<int> threads_on(masks.size());
  PT_MPI(MPI_Allgather(&p.threads, 1, MPI_INT, threads_on.data(), 1, MPI_INT, node));
  int demand = 0;
  for (std::size_t r = 0; r < masks.size(); ++r) demand += overlaps[r] ? threads_on[r] : 0;
  PT_MPI(MPI_Comm_free(&node));
  // over-committed: a threaded rank whose cores have fewer CPUs than threads to run
  const int crowded = p.threads > 1 && demand > cpus ? 1 : 0;
  const int unthreaded = !threaded && asked ? 1 : 0;

  char line[kCoresChars + 1] = {};
  const std::string text = cpu_ranges(mine);
  std::snprintf(line, sizeof line, "%s",
                text.size() <= kCoresChars ? text.c_str()
                                           : (text.substr(0, kCoresChars - 3) + "...").c_str());
  int rank = 0, size = 1;
  PT_MPI(MPI_Comm_rank(world, &rank));
  PT_MPI(MPI_Comm_size(world, &size));
  const auto n = static_cast<std::size_t>(size);
  std::vector<char> all(rank == 0 ? n * sizeof line : 0);
  std::vector<int> info(rank == 0 ? 4 * n : 0);
  const int mine_info[4] = {p.threads, cpus, demand, crowded + 2 * unthreaded};
  PT_MPI(MPI_Gather(line, sizeof line, MPI_CHAR, all.data(), sizeof line, MPI_CHAR, 0, world));
  PT_MPI(MPI_Gather(mine_info, 4, MPI_INT, info.data(), 4, MPI_INT, 0, world));
  if (rank != 0) return p;
  int first_crowded = -1, unthreaded_ranks = 0;
  for (std::size_t r = 0; r < n; ++r) {
    p.cores.emplace_back(all.data() + r * sizeof line);
    p.threads_of.push_back(info[4 * r]);
    if ((info[4 * r + 3] & 1) != 0 && first_crowded < 0) first_crowded = static_cast<int>(r);
    unthreaded_ranks += (info[4 * r + 3] & 2) != 0 ? 1 : 0;
  }
  if (first_crowded >= 0) {
    const auto r = static_cast<std::size_t>(first_crowded);
    const int t = info[4 * r], c = info[4 * r + 1], d = info[4 * r + 2];
    p.warning =
        "warning: rank " + std::to_string(first_crowded) + " runs " + std::to_string(t) +
        " threads on " + std::to_string(c) + " core(s) (" + p.cores[r] + ")" +
        (d > t ? ", shared with other ranks' threads (" + std::to_string(d) + " in all)" : "") +
        ": threads that share a core take turns and the step slows down.\n---> HINT: " +
        "give each rank " + std::to_string(t) + " cores: " + binding_fix(t) +
        "; or set device.threads to the cores a rank has\n";
  }
  if (unthreaded_ranks > 0) {
    p.warning += "warning: threads per rank were asked for (device.threads or OMP_NUM_THREADS) "
                 "but this build's Kokkos has no threaded host backend: every rank runs one "
                 "thread.\n---> HINT: tools/setup-kokkos builds Kokkos with OpenMP; or configure "
                 "with -DKokkos_ROOT=DIR (docs/architecture.md)\n";
  }
  return p;
}

} // namespace pt
