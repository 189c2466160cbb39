// In-place reductions of floats over a group of ranks, in a kernel backend's memory: the
// interface model/ is handed for its tensor-parallel sums (model/ includes no MPI). make_reducer
// (comm/reducers.hpp) gives the implementation: MPI, host-staged MPI or NCCL.
#pragma once

#include <cstddef>
#include <cstdint>

#include "config/enums.hpp"

namespace pt {

class GroupReducer {
public:
  virtual ~GroupReducer() = default;
  // x[0, n) in the backend's memory, reduced in place over every rank of the group; each rank
  // calls with the same n in the same order. The result is ready for the backend's next op.
  // wire bf16 (activations in the bf16 format, docs/precision.md): the values travel as bf16
  // and every partial sum is rounded to bf16; NCCL still moves fp32.
  virtual void sum(float* x, std::size_t n, ActFormat wire = ActFormat::fp32) = 0;
  virtual void max(float* x, std::size_t n) = 0;
  // Sequence parallelism's pair (docs/tensor-parallel.md). reduce_scatter: x[0, n*size) summed
  // over the group, this rank's block [rank*n, (rank+1)*n) written to out[0, n); all_gather:
  // every rank's in[0, n) into out[0, n*size) in rank order. out never overlaps the input.
  virtual void reduce_scatter(float* out, const float* x, std::size_t n,
                              ActFormat wire = ActFormat::fp32) = 0;
  virtual void all_gather(float* out, const float* in, std::size_t n,
                          ActFormat wire = ActFormat::fp32) = 0;
  // Bytes this rank has handed to the collectives so far (what it sends: 2 a value in bf16).
  virtual std::uint64_t bytes() const = 0;
};

} // namespace pt
