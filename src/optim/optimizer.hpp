// A chunk's optimizer, chosen once at setup: AdamW over the chunk's whole gradients, or ZeRO-1's
// AdamW (optim/zero_adamw.hpp) over this rank's blocks of their dp sum, which it reduce-scatters
// itself. Besides the update: the gradients the global norm counts, and what a checkpoint reads
// and writes of it: its update count and, per tensor of the chunk, the runs of the tensor's
// elements whose moments this rank holds. A whole optimizer holds every element; ZeRO-1 its dp
// block of each bucket, so each rank writes and reads its own runs in place, with no whole-size
// copy.
#pragma once

#include <cstddef>
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

  // Elements [offset, offset + size) of the gradients step() reads (summed_grads()) that belong
  // to tensor `tensor` (its index in the chunk's ParamLayout).
  struct Span {
    std::size_t tensor = 0, offset = 0, size = 0;
  };

  virtual ~Optimizer() = default;
  // After the chunk's gradients are final on this rank (the tied embedding summed): ZeRO-1
  // reduce-scatters them over dp; a whole optimizer has nothing to do (GradSync summed them).
  virtual void reduce(const float* /*grads*/) {}
  // The gradients step() reads, given the chunk's: those, or ZeRO-1's shard of their dp sums.
  virtual const float* summed_grads(const float* grads) const { return grads; }
  // Where summed_grads() holds each tensor's elements (the global norm reads them).
  virtual std::vector<Span> grad_spans() const = 0;
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
  // Optimizer post-validation (train.post_validation): save() keeps a copy of the state an update
  // changes (moments and update count; the copy is made on first use, in the same memory),
  // restore() puts it back, so an update can be undone bit for bit.
  virtual void save() = 0;
  virtual void restore() = 0;
};

} // namespace pt
