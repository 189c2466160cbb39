// Interconnect model for choosing an all-reduce algorithm (comm.topology, docs/collectives.md).
// Two levels, each with alpha (seconds per message), beta (seconds per byte on one link) and
// gamma (seconds per byte of float32 summation): inside a node and between nodes. The modelled
// time of each algorithm follows its implementation in allreduce.cpp step by step, with nodes
// of consecutive ranks; a node's network link is shared by its ranks when several of them send
// across nodes in the same step (recursive doubling, Rabenseifner, the cross-node step of
// hierarchical).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "config/enums.hpp"

namespace pt {

struct LinkCost {
  double alpha = 0.0; // s per message
  double beta = 0.0;  // s per byte
  double gamma = 0.0; // s per byte summed
  double copy = 0.0;  // s per byte copied by a rank (shared-memory window steps)

  double message(double bytes) const { return alpha + bytes * beta; } // one exchange each way
};

struct Topology {
  std::string name;           // flat | fat-tree | tianhe | node | calibrated (file path)
  LinkCost intra;             // between ranks of one node
  LinkCost inter;             // between nodes (one network link per node)
  bool inter_measured = true; // false: a calibration run on one node kept the default
};

// Presets: "fat-tree" (HDR InfiniBand class), "tianhe" (TH Express-2A class: 1 us, 14 Gbit/s),
// "flat" (every link a fat-tree network link), "node" (one node: shared memory only).
// Throws std::invalid_argument for other names.
Topology topology_preset(const std::string& name);

// Reads a calibration file written by `pipetrain-bench calibrate`. Throws pt::Error (input)
// naming the file and the problem.
Topology load_calibration(const std::string& path);

// The deck's comm.topology / comm.calibration for a group spread over `nodes` nodes: the
// calibration file when given; "auto": "node" on one node, "fat-tree" across nodes.
Topology resolve_topology(const std::string& topology, const std::string& calibration, int nodes);

// The calibration file's text for `t`; `header` lines become comments.
std::string calibration_toml(const Topology& t, const std::string& header);

// Modelled seconds of an in-place all-reduce of `bytes` over p ranks in nodes of node_size
// consecutive ranks (0 or 1: one rank per node), as allreduce.cpp implements each algorithm.
// mpi: not modelled (returns a negative number).
double modelled_time(AllreduceAlgo algo, double bytes, int p, int node_size, const Topology& t);

// Lower bound from bandwidth alone: every node sends and receives 2(N-1)/N of the data through
// its one network link (N nodes); on one node, 2(p-1)/p of it through memory.
double bandwidth_bound(double bytes, int p, int node_size, const Topology& t);

// The algorithms "auto" chooses from, and its choice: the least modelled time.
const std::vector<AllreduceAlgo>& modelled_algorithms();
AllreduceAlgo choose_algorithm(double bytes, int p, int node_size, const Topology& t);

// auto's rule, for the all-reduce's and the all-to-all's algorithms (Algo): of the candidates'
// measured seconds, the fastest, unless the model's choice is within 5% of it (below a few
// microseconds two algorithms differ by less than a call jitters; the model then decides).
template <class Algo>
Algo auto_pick(const std::vector<std::pair<Algo, double>>& seconds, Algo model) {
  if (seconds.empty()) return model;
  const auto fastest =
      std::min_element(seconds.begin(), seconds.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  for (const auto& [algo, s] : seconds) {
    if (algo == model && s <= 1.05 * fastest->second) return model;
  }
  return fastest->first;
}

// Columns of the near-square grid torus2d uses: p / (the largest divisor of p <= sqrt(p)).
int grid_columns(int p);

// Ranks per row of a two-level algorithm on p ranks, node_size consecutive ranks per node:
// hierarchical's rows are the nodes (one node of all p ranks when node_size >= p), torus2d's
// the rows of its grid. 0 where the algorithm runs as Rabenseifner instead (one rank per node,
// nodes of unequal size, a grid of one row or one column) and for the one-level algorithms.
// The runtime (allreduce.cpp) and the model both follow it.
int two_level_row(AllreduceAlgo algo, int p, int node_size);

// Floats of a message that hierarchical's node-local step moves through the shared window at
// a time (split over the node's ranks): longer messages go in segments, each with three barriers.
constexpr std::size_t kWindowSegmentFloats = std::size_t{1} << 18;

} // namespace pt
