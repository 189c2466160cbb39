// Float32 sum all-reduce algorithms on MPI point-to-point (comm.allreduce in the deck).
// Cost models (alpha = latency, beta = time per byte, gamma = reduction time per byte, n bytes,
// p ranks; Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
// MPICH", IJHPCA 2005; Patarasuk & Yuan, JPDC 2009):
//   ring                 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma   (bandwidth-optimal)
//   recursive doubling   log2(p) (alpha + n beta + n gamma)                   (latency-optimal)
//   rabenseifner         2 log2(p) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
// Non-powers of two: the first 2r ranks (r = p - 2^floor(log2 p)) pair up and fold first.
// topology.hpp models each algorithm per level; "auto" takes the least modelled time.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/topology.hpp"

namespace pt {

class Watchdog;

// Deck name -> algorithm: "mpi", "ring", "recursive-doubling", "rabenseifner", "hierarchical",
// "torus2d"; "auto" -> nullopt. Throws std::invalid_argument for other names.
std::optional<AllreduceAlgo> parse_allreduce(const std::string& name);

struct AllreduceOptions {
  std::optional<AllreduceAlgo> algo; // nullopt: auto, by the topology model per message size
  int node_size = 0;                 // ranks per node, consecutive ranks; 0 or 1: one per node
  Topology topology = topology_preset("fat-tree");
  bool shared_memory = true; // hierarchical: node-local step through an MPI-3 shared window
  const Watchdog* watchdog = nullptr;  // "mpi": MPI_Allreduce under the hang watchdog
  std::string what = "the all-reduce"; // for the watchdog's message
};

// In-place sums over one communicator. Keeps what repeated calls need: scratch memory, the
// sub-communicators of the two-level algorithms and the shared-memory window, so a training
// step neither allocates nor creates communicators. Every rank of comm calls sum() with the
// same n. Free it before MPI_Finalize.
class Allreducer {
public:
  Allreducer(MPI_Comm comm, AllreduceOptions opt);
  ~Allreducer();
  Allreducer(const Allreducer&) = delete;
  Allreducer& operator=(const Allreducer&) = delete;

  void sum(float* buf, std::size_t n);
  // The algorithm sum() runs for n floats (auto: the model's choice).
  AllreduceAlgo algorithm_for(std::size_t n) const;
  int size() const { return size_; }
  // True when hierarchical's node-local step ran through the shared-memory window.
  bool used_shared_memory() const { return used_shm_; }

private:
  struct Groups; // row/column communicators of a two-level scheme and the node's window
  Groups& groups(int c);
  void two_level(float* buf, std::size_t n, int c, bool node_local);
  void shm_two_level(float* buf, std::size_t n, Groups& g);

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  AllreduceOptions opt_;
  std::vector<float> tmp_, tmp2_; // scratch kept between calls
  std::map<int, Groups*> groups_;
  bool used_shm_ = false;
  // auto: the last size's choice (the trainer repeats a few bucket sizes)
  mutable std::size_t last_n_ = 0;
  mutable AllreduceAlgo last_algo_ = AllreduceAlgo::ring;
};

// One-off sum (tests, tools): builds an Allreducer for the call.
void allreduce_sum(float* buf, std::size_t n, MPI_Comm comm, AllreduceAlgo algo, int node_size = 0);

} // namespace pt
