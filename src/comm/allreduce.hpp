// Float32 in-place sum all-reduce algorithms on MPI point-to-point (comm.allreduce in the deck).
// Cost models (alpha = latency, beta = time per byte, gamma = reduction time per byte, n bytes,
// p ranks; Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
// MPICH", IJHPCA 2005; Patarasuk & Yuan, JPDC 2009):
//   ring                 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma   (bandwidth-optimal)
//   recursive doubling   log2(p) (alpha + n beta + n gamma)                   (latency-optimal)
//   rabenseifner         2 log2(p) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
// Non-powers of two: the first 2r ranks (r = p - 2^floor(log2 p)) pair up and fold first.
// topology.hpp models each algorithm per level; "auto" takes the least modelled time, refined by
// one measurement per message size (comm.autotune).
// Every algorithm sums in an order fixed by the ranks alone, never by timing.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/topology.hpp"
#include "comm/watchdog.hpp"
#include "util/memory_count.hpp"

namespace pt {

// A communicator as the algorithms use it. Every blocking step waits under the hang watchdog,
// naming `what` (the caller's name for the reduction).
struct ReduceComm {
  ReduceComm(MPI_Comm comm, const Watchdog& watchdog, const std::string& what);
  MPI_Comm comm;
  int rank = 0, size = 1;
  const Watchdog& watchdog;
  const std::string& what;
  // send to `to` while receiving from `from` (floats)
  void exchange(const float* send, std::size_t ns, int to, float* recv, std::size_t nr,
                int from) const;
  void send(const float* x, std::size_t n, int to) const;
  void recv(float* x, std::size_t n, int from) const;
  void barrier() const;
};

// The one-level algorithms: buf (n floats) summed in place over every rank of c; tmp is scratch,
// grown as needed.
void ring_allreduce(float* buf, std::size_t n, const ReduceComm& c, CountedVector<float>& tmp);
void recursive_doubling_allreduce(float* buf, std::size_t n, const ReduceComm& c,
                                  CountedVector<float>& tmp);
void rabenseifner_allreduce(float* buf, std::size_t n, const ReduceComm& c,
                            CountedVector<float>& tmp);

// ZeRO-1's collectives (optim/zero_adamw.hpp), on p blocks of `each` floats. reduce_scatter_blocks:
// rank r gets block r of `in` summed over every rank, into out (each floats), always in rank
// order 0, 1, ..., p-1, so an element's sum does not depend on where it sits; tmp is scratch.
// all_gather_blocks: block k of out (p * each floats) gets rank k's `mine`.
void reduce_scatter_blocks(const float* in, float* out, std::size_t each, const ReduceComm& c,
                           CountedVector<float>& tmp);
void all_gather_blocks(const float* mine, float* out, std::size_t each, const ReduceComm& c);

struct AllreduceOptions {
  std::optional<AllreduceAlgo> algo; // nullopt: auto
  int node_size = 0;                 // ranks per node, consecutive ranks; 0 or 1: one per node
  Topology topology = topology_preset("fat-tree");
  bool shared_memory = true; // hierarchical: node-local step through an MPI-3 shared window
  // auto: the first call of each size times every distinct algorithm once and keeps the fastest
  // (comm.autotune); false: the model alone decides (runtime.deterministic)
  bool autotune = true;
  const Watchdog* watchdog = &Watchdog::none(); // every blocking wait under it
  std::string what = "the all-reduce";          // for the watchdog's message
};

// auto's measurement of one message size: each candidate's time (the faster of two calls, the
// slowest rank's), the model's choice and the pick.
struct AutoChoice {
  AllreduceAlgo model = AllreduceAlgo::ring;
  AllreduceAlgo pick = AllreduceAlgo::ring;
  std::vector<std::pair<AllreduceAlgo, double>> seconds;
};

// In-place sums over one communicator. Keeps what repeated calls need (scratch, the
// sub-communicators of the two-level algorithms, hierarchical's shared-memory window), so a
// training step neither allocates nor creates communicators. Every rank of comm calls sum()
// with the same n, in the same order. Free it before MPI_Finalize.
class Allreducer {
public:
  Allreducer(MPI_Comm comm, AllreduceOptions opt);
  ~Allreducer();
  Allreducer(const Allreducer&) = delete;
  Allreducer& operator=(const Allreducer&) = delete;

  void sum(float* buf, std::size_t n);
  // The algorithm sum() runs for n floats: the deck's, auto's measured pick once sum() has seen
  // n, else the model's choice.
  AllreduceAlgo algorithm_for(std::size_t n) const;
  // auto's measurements, per size in floats.
  const std::map<std::size_t, AutoChoice>& measured() const { return measured_; }
  int size() const { return size_; }
  // True when hierarchical's node-local step ran through the shared-memory window.
  bool used_shared_memory() const { return used_shm_; }

private:
  struct TwoLevel; // row/column communicators of a two-level scheme and the node's window
  TwoLevel& two_level_groups(int c);
  void two_level(float* buf, std::size_t n, int c, bool node_local);
  void window_step(float* buf, std::size_t n, TwoLevel& g);
  void run(AllreduceAlgo algo, float* buf, std::size_t n);
  void measure(float* buf, std::size_t n);
  std::vector<AllreduceAlgo> candidates();

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  AllreduceOptions opt_;
  ReduceComm all_;
  CountedVector<float> tmp_, saved_; // scratch; auto's copy of a bucket while it measures
  std::map<int, TwoLevel*> groups_;
  bool used_shm_ = false;
  std::map<std::size_t, AutoChoice> measured_;
};

} // namespace pt
