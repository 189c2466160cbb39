// What the modes of pipetrain-bench share: flags, sizes printed for people, the topology model
// from the flags, and the ranks per node.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "comm/topology.hpp"

namespace bench {

struct Args {
  std::vector<std::string> rest;
  std::string get(const std::string& flag, const std::string& fallback) const;
  // a non-negative number (std::invalid_argument naming the flag otherwise)
  double num(const std::string& flag, double fallback) const;
};

std::string human(double bytes); // "8 B", "4 KiB", "16 MiB"

// --topology T | --calibration F for a group spread over `nodes` nodes
pt::Topology topology_from(const Args& a, int nodes);

// Ranks per node: --ranks-per-node, or the size of this rank's shared-memory group when every
// node holds the same number of ranks (else 1).
int ranks_per_node(const Args& a, MPI_Comm comm);

// OSU-style timing of `cols` columns, each call timed alone (time_call(k): the seconds of one
// call of column k, between barriers): two warm-up rounds (the second's mean sets the number of
// timed calls, about `seconds` a column), then rounds in an order drawn afresh each round (the
// same on every rank), so that drift on a shared machine hits all columns alike. Returns each
// column's t90: the max over ranks of the mean of each rank's fastest 90% of calls.
std::vector<double> time_rounds(std::size_t cols,
                                const std::function<double(std::size_t)>& time_call, double seconds,
                                std::mt19937& shuffler);

int bench_allreduce(const Args& a);
int bench_alltoall(const Args& a);
int simulate(const Args& a);
int calibrate(const Args& a);
int bench_gemm(const Args& a); // no MPI

} // namespace bench
