// Threads per rank (device.threads) and the cores each rank may run on: the default thread
// count, the startup table's columns, and the warning when threads outnumber their cores.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace pt {

struct Placement {
  int threads = 1;                // this rank's host threads
  std::vector<std::string> cores; // rank 0: each rank's allowed cores ("0-3,8"), world order
  std::vector<int> threads_of;    // rank 0: each rank's threads
  std::string warning;            // rank 0: empty, or one warning naming the fix
};

// Collective over world. requested: device.threads; 0 takes OMP_NUM_THREADS where it is set,
// else the cores of this rank's affinity mask divided among the ranks of its node whose masks
// overlap it. threaded: whether the host backend runs threads at all (else every rank gets 1).
Placement place_threads(MPI_Comm world, int requested, bool threaded);

// How to give each rank n cores under the launcher that started this job (Open MPI, MPICH's
// Hydra, Slurm's srun), or under each of them when it cannot tell.
std::string binding_fix(int n);

// "0-3,8": the CPUs of a mask given as a list of CPU numbers, ascending.
std::string cpu_ranges(const std::vector<int>& cpus);

} // namespace pt
