// Pipeline point-to-point messages (docs/design.md section 6): the activations and gradients a
// pipeline rank exchanges with its neighbours, over MPI (host memory, matched by tag) or, with
// comm.gpu_p2p = "nccl", over NCCL links (device memory, matched by each link's order,
// docs/cuda.md). Every wait is under the hang watchdog.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/watchdog.hpp"
#include "cuda/nccl.hpp"
#include "schedule/schedule.hpp"
#include "util/memory_count.hpp"

namespace pt {

class PipeTransport {
public:
  // A message as its receiver names it: (dir 0 activation / 1 gradient, mb, receiver's chunk).
  using Msg = std::tuple<int, int, int>;
  // A message in flight: an MPI request, or message k of NCCL link `link`. A bf16 receive
  // arrives packed at the start of `unpack_to` and is widened in place by wait(); a bf16 send
  // from a packed copy holds copy `wire` of the pool until wait().
  struct Handle {
    MPI_Request req = MPI_REQUEST_NULL;
    std::size_t link = 0;
    int k = -1;
    float* unpack_to = nullptr;
    int wire = -1;
  };

  // pp: the pipeline communicator, me: this rank's pipeline coordinate, n: floats per message.
  // links: empty (MPI), or one entry per channel of schedule::channels(sched), the NCCL link of
  // each channel this rank sends or receives on (null for the others). bf16: the values are
  // bf16 numbers held in floats (the activation format, docs/precision.md) and MPI moves them as
  // 2 bytes each, exactly (NCCL links still move 4). Throws input_error when the schedule's tags
  // exceed this MPI's MPI_TAG_UB.
  PipeTransport(MPI_Comm pp, const schedule::Schedule& sched, int me, const Watchdog& watchdog,
                std::vector<std::unique_ptr<cuda::NcclLink>> links, std::size_t n,
                bool bf16 = false);

  // Whether the step's messages move device memory (NCCL links) rather than host memory (MPI).
  bool device() const { return nccl_; }

  // Posts every receive of the step list `actions` (its RECV_ACT/RECV_GRAD), message m into
  // buffer(m): n floats in the memory device() says. NCCL links carry no tags, so each link's
  // receives are queued in the order its sender sends them, whatever order the actions need.
  // over_mpi: over MPI into host memory whatever the links (evaluation's list, whose messages
  // are not the step's that the links are set up for).
  std::map<Msg, Handle> receive_step(const std::vector<schedule::Action>& actions,
                                     const std::function<float*(const Msg&)>& buffer,
                                     bool over_mpi = false);
  // Posts over MPI the receive of RECV_ACT or RECV_GRAD action `a` into x (n floats of host
  // memory): a step's receives one by one, as their buffers free (PipelineEngine).
  Handle receive(const schedule::Action& a, float* x);
  // Starts sending x[0, n), left unchanged until wait(): (dir, mb, chunk) are this rank's, peer
  // the receiving pipeline rank; over_mpi as for receive_step. consume: x is not read again by
  // anyone, so bf16 packs it in place (else into a copy taken from a pool until wait()).
  Handle start_send(const float* x, int dir, int mb, int chunk, int peer, bool over_mpi = false,
                    bool consume = false);
  // `what` names the wait in the watchdog's message. Returns the seconds waited.
  double wait(Handle& h, const std::string& what) const;
  // Bytes this rank has sent so far (what the wire carries: 2 a value at bf16 over MPI).
  std::uint64_t bytes_sent() const { return bytes_sent_; }

private:
  int tag(int dir, int mb, int sender_stage) const;
  Handle isend(const float* x, int dir, int mb, int chunk, int peer, bool consume = false);
  Handle irecv(float* x, int dir, int mb, int chunk, int peer);

  MPI_Comm pp_;
  const schedule::Schedule& sched_;
  int me_;
  const Watchdog& watchdog_;
  std::vector<std::unique_ptr<cuda::NcclLink>> links_;
  std::size_t n_;
  bool nccl_ = false;
  bool bf16_ = false;
  std::uint64_t bytes_sent_ = 0;
  // bf16 over MPI: packed copies of the sends that may not be packed in place, as many as are in
  // flight at once, reused
  mutable std::vector<CountedVector<std::uint16_t>> pool_;
  mutable std::vector<int> free_;
  std::vector<std::pair<std::size_t, Msg>> nccl_receives_;    // (link, message) in link order
  std::map<std::pair<int, int>, std::size_t> nccl_send_link_; // (dir, peer) -> link
};

} // namespace pt
