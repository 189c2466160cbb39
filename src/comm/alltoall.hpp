// Exchange of variable-size float blocks among the ranks of a group: the all-to-all(v) that moves
// an MoE layer's tokens to the ranks of their experts and back (docs/moe.md, docs/collectives.md).
// Rank r sends send_counts[q] floats to rank q and receives recv_counts[q] floats from q, the
// blocks of both buffers in rank order. Algorithms (alpha-beta model of comm/topology.hpp; p
// ranks in nodes of g consecutive ranks, N = p / g nodes, b the bytes of one block):
//   mpi           MPI_Alltoallv, the library's own
//   pairwise      p - 1 steps; in step s rank r sends to r + s and receives from r - s (mod p):
//                 every block moves once, directly (bandwidth-optimal); a node's g ranks share
//                 its network link in the steps that cross nodes
//   hierarchical  node-aware: every rank's blocks go to its node's leader (its first rank), the
//                 leaders exchange pairwise one message per pair of nodes holding the g x g
//                 blocks between them, and each leader hands its ranks what they receive:
//                 N - 1 network messages per node instead of g (p - g), for small blocks
// auto takes the least modelled time, refined by timing each candidate once per size class
// (comm.autotune's rule, auto_pick). Every rank of the group calls the same exchanges in the same
// order, under the hang watchdog; a block whose size differs from what its receiver was told is
// refused with an error naming the two ranks and both counts, never a hang or a truncation.
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

enum class AlltoallAlgo { mpi, pairwise, hierarchical };
const char* alltoall_name(AlltoallAlgo a);
// "mpi" | "pairwise" | "hierarchical"; "auto": nullopt. Throws std::invalid_argument otherwise.
std::optional<AlltoallAlgo> parse_alltoall(const std::string& name);

// Modelled seconds of an all-to-all in which every rank sends a block of `block_bytes` to every
// rank, on p ranks in nodes of node_size consecutive ranks (0 or 1: one rank a node). mpi: not
// modelled (negative).
double modelled_alltoall(AlltoallAlgo a, double block_bytes, int p, int node_size,
                         const Topology& t);

struct AlltoallOptions {
  std::optional<AlltoallAlgo> algo; // nullopt: auto
  int node_size = 0;                // ranks per node, consecutive ranks; 0 or 1: one a node
  Topology topology = topology_preset("fat-tree");
  bool autotune = true; // auto: time the candidates on the first call of each size class
  const Watchdog* watchdog = &Watchdog::none();
  std::string what = "the all-to-all"; // for the watchdog's and the errors' messages
};

class Alltoaller {
public:
  // Collective over comm (dups it). Free it before MPI_Finalize.
  Alltoaller(MPI_Comm comm, AlltoallOptions opt);
  ~Alltoaller();
  Alltoaller(const Alltoaller&) = delete;
  Alltoaller& operator=(const Alltoaller&) = delete;

  // Each rank's send counts to every rank (p ints) in; what every rank sends here out (p ints):
  // the receivers' counts for exchange(). A negative count is refused. per > 1: per ints to each
  // rank (p * per, blocks in rank order), e.g. one count per expert the receiver holds.
  void exchange_counts(const int* send_counts, int* recv_counts, int per = 1);
  // The blocks. class_bytes: the size class auto decides by, the same on every rank (a caller
  // whose counts vary passes a bound they share, e.g. a capacity; 0: the largest block of this
  // rank's, for callers whose every rank sends the same sizes).
  void exchange(const float* send, const int* send_counts, float* recv, const int* recv_counts,
                std::size_t class_bytes = 0);
  // The algorithm exchange() runs for a size class: the deck's, auto's measured pick once
  // exchange() has seen the class, else the model's choice.
  AlltoallAlgo algorithm_for(std::size_t class_bytes) const;
  int size() const { return size_; }
  // Seconds spent in exchange_counts() and exchange() since the last call (this rank's)
  double take_seconds() { return std::exchange(seconds_, 0.0); }

private:
  struct Node;     // hierarchical's node and leader communicators
  struct Gathered; // hierarchical's leader: its node's counts and where its blocks lie
  void run(AlltoallAlgo a, const float* send, const int* sc, float* recv, const int* rc);
  void pairwise(const float* send, const int* sc, float* recv, const int* rc);
  void library(const float* send, const int* sc, float* recv, const int* rc);
  void hierarchical(const float* send, const int* sc, float* recv, const int* rc);
  void leaders_exchange(const Gathered& g, const std::vector<int>& rs);
  void receive_checked(float* buf, int count, int from, MPI_Comm comm, const char* who,
                       MPI_Request& req) const;
  void swap(const float* out, int n, int to, float* in, int count, int from, MPI_Comm comm,
            const char* who) const;
  [[noreturn]] void wrong_count(const std::string& peer, long got, long want) const;
  AlltoallAlgo measure(const float* send, const int* sc, float* recv, const int* rc,
                       std::size_t cls);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  AlltoallOptions opt_;
  Node* node_ = nullptr;
  // scratch: hierarchical's gathered blocks, a node's blocks received, a leader's out-going
  // blocks and its ranks' receives
  CountedVector<float> tmp_, tmp2_, pack_, out_;
  std::map<std::size_t, AlltoallAlgo> measured_; // by size class (a power of two of bytes)
  double seconds_ = 0.0;
};

} // namespace pt
