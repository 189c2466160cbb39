// NCCL communicators for the CUDA backend's data- and tensor-parallel reductions
// (comm.gpu_collectives, docs/cuda.md). They reduce device memory in place, queued on
// a stream, so no host copy and no host wait is needed per call. Every function exists in every
// build; without CUDA and NCCL they throw std::runtime_error saying so. The caller moves the
// unique id between ranks (an MPI broadcast), so this layer needs no MPI.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <vector>

namespace pt::cuda {

using NcclId = std::array<char, 128>; // ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES)

// True when this build links NCCL (and CUDA).
bool nccl_compiled();
// A fresh id for one communicator; made on one rank and broadcast to the others.
NcclId nccl_unique_id();

class NcclComm {
public:
  // Collective over the `nranks` processes that pass the same id, each on the GPU its CUDA
  // backend started (cuda::start before this). side_stream: reductions run on a stream of
  // their own, after the ops queued on the backend's stream so far (gradient buckets, so the
  // backward goes on while they run); otherwise on the backend's stream, in order with the
  // ops (tensor-parallel sums).
  NcclComm(const NcclId& id, int nranks, int rank, bool side_stream);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // x[0, n) (device memory) summed, or maximised, in place over the group; queued.
  void sum(float* x, std::size_t n);
  void max(float* x, std::size_t n);
  // Reduce-scatter: x[0, n*ranks) summed over the group, this rank's block of n written to out;
  // all-gather: every rank's in[0, n) into out[0, n*ranks) in rank order. Queued.
  void reduce_scatter(float* out, const float* x, std::size_t n);
  void all_gather(float* out, const float* in, std::size_t n);
  // The host waits until every reduction queued so far has finished.
  void wait();

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One direction of pipeline messages between two ranks (comm.gpu_p2p = "nccl", docs/cuda.md):
// a two-rank NCCL communicator on a stream of its own, the sender its rank 0. NCCL's sends and
// receives carry no tags: a link delivers its messages in the order they were queued, so both
// ends queue them in the same order (schedule::channels). Messages are numbered from 0 after
// each restart(); each has an event that done() asks about, so the host never blocks on one.
class NcclLink {
public:
  // Collective over the two ranks passing the same id, each on the GPU its CUDA backend started.
  // Also moves one float across, so NCCL's connection exists before the first step.
  NcclLink(const NcclId& id, bool sender);
  ~NcclLink();
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  // Queues the sending of x[0, n) (device memory) after the ops queued on the
  // backend's stream so far. Returns the message's number.
  int send(const float* x, std::size_t n);
  // Queues the receiving of the next message into x[0, n). Returns its number.
  int recv(float* x, std::size_t n);
  // Whether message k has arrived (receiver) or left x (sender). Throws std::runtime_error
  // naming NCCL's error when the communicator has failed (a peer died).
  bool done(int k);
  // Numbers start from 0 again; every message queued so far must be done.
  void restart();

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace pt::cuda
