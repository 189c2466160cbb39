// A chunk's optimizer, chosen once at setup: AdamW over the chunk's whole gradients, or ZeRO-1's
// shard of it (comm/zero.hpp) over this rank's blocks of their dp sum. Besides the update, what a
// checkpoint reads and writes of it: its update count and, per tensor of the chunk, the runs of
// the tensor's elements whose moments this rank holds. A whole optimizer holds every element;
// ZeRO-1 its dp block of each bucket, so each rank writes and reads its own runs in place, with
// no whole-size copy.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace pt {

class Optimizer {
public:
  // Local elements [begin, begin + size) of a tensor (its tp shard's flat order), and where
  // their first and second moments are (the optimizer's backend memory).
  struct Run {
    std::size_t begin = 0, size = 0;
    float* m = nullptr;
    float* v = nullptr;
  };

  virtual ~Optimizer() = default;
  // One update of params (the chunk's flat buffer) with learning rate lr from grads times
  // grad_scale (clipping). ZeRO-1 reads the summed blocks its reduce() made, not grads.
  virtual void step(float* params, const float* grads, double lr, float grad_scale) = 0;
  virtual int updates() const = 0;     // updates applied so far
  virtual void set_updates(int t) = 0; // after loading a checkpoint
  // The runs of tensor `tensor` (its index in the chunk's ParamLayout) this rank holds.
  virtual std::vector<Run> runs(std::size_t tensor) = 0;
  // true: the dp ranks hold disjoint runs (ZeRO-1), each writes its own; false: every dp replica
  // holds the whole state and one writes it.
  virtual bool sharded() const = 0;
};

// The optimizers of a rank's chunks, as a checkpoint takes them.
template <class O> std::vector<Optimizer*> states_of(std::vector<std::unique_ptr<O>>& opts) {
  std::vector<Optimizer*> out;
  for (auto& o : opts) out.push_back(o.get());
  return out;
}

} // namespace pt
