// Float32 sum all-reduce algorithms on MPI point-to-point (comm.allreduce in the deck).
// Cost models (alpha = latency, beta = time per byte, gamma = reduction time per byte, n bytes,
// p ranks; Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
// MPICH", IJHPCA 2005; Patarasuk & Yuan, JPDC 2009):
//   ring                 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma   (bandwidth-optimal)
//   recursive doubling   log2(p) (alpha + n beta + n gamma)                   (latency-optimal)
//   rabenseifner         2 log2(p) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
// Non-powers of two: the first 2r ranks (r = p - 2^floor(log2 p)) pair up and fold first.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

namespace pt {

enum class AllreduceAlgo { mpi, ring, recursive_doubling, rabenseifner, hierarchical, torus2d };

// "mpi", "ring", "recursive-doubling", "rabenseifner", "hierarchical", "torus2d"; "auto" maps to
// mpi until the topology model chooses. Throws std::invalid_argument for other names.
AllreduceAlgo allreduce_algo(const std::string& name);

// In-place sum of n floats over comm. node_size: ranks per node for the hierarchical algorithm
// (consecutive ranks form a node; 0 or not dividing the size: falls back to rabenseifner).
// scratch: a buffer the caller keeps between calls (grown as needed), so large reductions do
// not allocate and fault in fresh memory each time; null: a temporary one.
void allreduce_sum(float* buf, std::size_t n, MPI_Comm comm, AllreduceAlgo algo, int node_size = 0,
                   std::vector<float>* scratch = nullptr);

} // namespace pt
