// What a checkpoint reads and writes of an optimizer (AdamW, or ZeRO-1's shard of it): its
// update count and, per tensor of the chunk, the runs of the tensor's elements whose moments this
// rank holds. A whole optimizer holds every element; ZeRO-1 holds its dp block of each bucket, so
// a checkpoint writes and reads each rank's runs in place, with no whole-size copy.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace pt {

class OptimizerState {
public:
  // Local elements [begin, begin + size) of a tensor (its tp shard's flat order), and where
  // their first and second moments are (the optimizer's backend memory).
  struct Run {
    std::size_t begin = 0, size = 0;
    float* m = nullptr;
    float* v = nullptr;
  };

  virtual ~OptimizerState() = default;
  virtual int updates() const = 0;     // updates applied so far
  virtual void set_updates(int t) = 0; // after loading a checkpoint
  // The runs of tensor `tensor` (its index in the chunk's ParamLayout) this rank holds.
  virtual std::vector<Run> runs(std::size_t tensor) = 0;
  // true: the dp ranks hold disjoint runs (ZeRO-1), each writes its own; false: every dp replica
  // holds the whole state and one writes it.
  virtual bool sharded() const = 0;
};

// The optimizers of a rank's chunks as checkpoint states.
template <class O> std::vector<OptimizerState*> states_of(std::vector<std::unique_ptr<O>>& opts) {
  std::vector<OptimizerState*> out;
  for (auto& o : opts) out.push_back(o.get());
  return out;
}

} // namespace pt
