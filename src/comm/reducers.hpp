// The implementations of GroupReducer (comm/group_reducer.hpp) and the NCCL setup of a run
// (comm.gpu_collectives, comm.gpu_p2p; docs/cuda.md).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "comm/group_reducer.hpp"
#include "comm/watchdog.hpp"
#include "config/run_config.hpp"
#include "cuda/nccl.hpp"
#include "schedule/schedule.hpp"

namespace pt {

class Layout;

// A reducer over `comm` for data in be's memory: with nccl, NCCL queued on the backend's stream
// in order with its ops; else MPI_Allreduce under the watchdog (named `what`), in place on the
// host, or on a host copy for a GPU backend. comm must outlive it.
std::unique_ptr<GroupReducer> make_reducer(MPI_Comm comm, const std::string& what,
                                           const Watchdog& watchdog, const Backend& be,
                                           std::unique_ptr<cuda::NcclComm> nccl = nullptr);

// This rank's index among the ranks that share its machine's memory, and how many they are:
// the physical node, which owns the GPUs (not comm.ranks_per_node's emulated one).
std::pair<int, int> physical_node(MPI_Comm world);

// comm.gpu_collectives (dp/tp reductions) or comm.gpu_p2p (pipeline messages), named by `key`,
// asking for `want`: whether a GPU backend's traffic of that kind goes
// through NCCL. False sets `why` to the reason. NCCL needs a build with it and a GPU of its own
// for every rank (it refuses two ranks of a communicator on one GPU); an explicit "nccl" that
// cannot be met is an input error, agreed by all ranks.
bool use_nccl(const std::string& key, GpuTransport want, const RunConfig& cfg, MPI_Comm world,
              std::string& why);

// One NCCL communicator over the ranks of `group` (collective over it): its rank 0 makes the
// id and broadcasts it. Failures anywhere are agreed over `world`.
std::unique_ptr<cuda::NcclComm> make_nccl(MPI_Comm group, bool side_stream, MPI_Comm world);

// comm.gpu_p2p = "nccl": the NCCL link of every channel of the schedule that starts or ends at
// this rank (null for the others), in schedule::channels' order. Every rank of the pipeline
// group walks that one list, so the two ends of each link meet at it together. The sender makes
// the id; the two ends tell each other whether they can go on, so neither is left alone in
// ncclCommInitRank once the other has failed. Failures are agreed over the world.
std::vector<std::unique_ptr<cuda::NcclLink>> make_nccl_links(const schedule::Schedule& sched,
                                                             const Layout& layout);

} // namespace pt
