// The 3D layout of the job: world = pp x dp x tp, tp innermost, then dp, then pp
// (rank r -> tp = r % tp, dp = (r / tp) % dp, pp = r / (tp*dp)), with a communicator per group and
// the node each rank runs on.
#pragma once

#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "comm/placement.hpp"
#include "config/run_config.hpp"

namespace pt {

struct Coords {
  int pp = 0, dp = 0, tp = 0;
};

Coords coords_of(int rank, int pp, int dp, int tp);

// A group's placement from the node of each of its ranks (in group rank order): the number of
// nodes, and the ranks per node when every node holds one block of that many consecutive ranks
// (else 1).
std::pair<int, int> group_nodes(const std::vector<int>& node_of);

class Layout {
public:
  // Collective over `world`. The config must already be validated against the world size.
  Layout(MPI_Comm world, const ParallelConfig& p, const CommConfig& c);
  ~Layout();
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;

  MPI_Comm world() const { return world_; }
  MPI_Comm dp_comm() const { return dp_comm_; } // same (pp, tp), all dp; rank = dp coordinate
  MPI_Comm pp_comm() const { return pp_comm_; } // same (dp, tp), all pp; rank = pp coordinate
  MPI_Comm tp_comm() const { return tp_comm_; } // same (pp, dp), all tp; rank = tp coordinate
  // Expert parallelism (parallel.ep, docs/moe.md): the block of ep consecutive dp ranks this
  // rank's tokens are exchanged in (rank = dp % ep), and the dp ranks holding the same experts
  // (rank = dp / ep), over which the experts' gradients are reduced. MPI_COMM_NULL when ep = 1.
  MPI_Comm ep_comm() const { return ep_comm_; }
  MPI_Comm expert_dp_comm() const { return edp_comm_; }
  int ep() const { return ep_; }
  int ep_rank() const { return me_.dp % ep_; }
  // First and last pipeline rank of this (dp, tp): they share the tied embedding. MPI_COMM_NULL
  // on other ranks and when pp = 1.
  MPI_Comm embedding_comm() const { return emb_comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  Coords coords() const { return me_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int node() const { return node_; } // node index, 0-based, in rank order
  int nodes() const { return nodes_; }
  int ranks_on_node() const { return ranks_on_node_; }
  // This rank's dp group as the all-reduce sees it: the nodes it spans, and its ranks per node
  // when every node holds one block of that many consecutive dp ranks (else 1: the topology
  // model and hierarchical then treat each rank as a node of its own).
  int dp_nodes() const { return dp_nodes_; }
  int dp_node_size() const { return dp_node_size_; }
  // The same of this rank's expert-parallel group (1, 1 when ep = 1).
  int ep_nodes() const { return ep_nodes_; }
  int ep_node_size() const { return ep_node_size_; }

  // The table of rank -> host, node, pp/dp/tp and, given a placement, each rank's cores and
  // threads (rank 0 holds it; others get an empty string).
  std::string table(const Placement* placement = nullptr) const;
  // Warnings about the placement (a tp group across nodes), for rank 0 to print; empty if none.
  const std::string& warnings() const { return warnings_; }

private:
  MPI_Comm world_;
  MPI_Comm dp_comm_ = MPI_COMM_NULL;
  MPI_Comm pp_comm_ = MPI_COMM_NULL;
  MPI_Comm tp_comm_ = MPI_COMM_NULL;
  MPI_Comm emb_comm_ = MPI_COMM_NULL;
  MPI_Comm ep_comm_ = MPI_COMM_NULL, edp_comm_ = MPI_COMM_NULL;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  std::string warnings_;
  int rank_ = 0, size_ = 1;
  int pp_ = 1, dp_ = 1, tp_ = 1, ep_ = 1;
  Coords me_;
  int node_ = 0, nodes_ = 1, ranks_on_node_ = 1;
  int dp_nodes_ = 1, dp_node_size_ = 1;
  int ep_nodes_ = 1, ep_node_size_ = 1;
  std::vector<std::string> hosts_; // rank 0 only
  std::vector<int> node_of_;       // rank 0 only
};

} // namespace pt
