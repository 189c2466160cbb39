// In-place reductions of floats over a group of ranks, in a kernel backend's memory: the
// interface model/ is handed for its tensor-parallel sums (model/ includes no MPI). make_reducer
// (comm/reducers.hpp) gives the implementation: MPI, host-staged MPI or NCCL.
#pragma once

#include <cstddef>

namespace pt {

class GroupReducer {
public:
  virtual ~GroupReducer() = default;
  // x[0, n) in the backend's memory, reduced in place over every rank of the group; each rank
  // calls with the same n in the same order. The result is ready for the backend's next op.
  virtual void sum(float* x, std::size_t n) = 0;
  virtual void max(float* x, std::size_t n) = 0;
};

} // namespace pt
