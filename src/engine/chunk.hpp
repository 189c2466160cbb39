// One pipeline chunk of this rank (virtual stage plan.schedule.stage_of(pp rank, c)): the stage
// it computes, the optimizer that updates it and the data-parallel reduction of its gradients,
// made together at setup (engine/setup.cpp); the step (engine/step.cpp) asks the chunk for each
// part of its gradient work and update.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/grad_sync.hpp"
#include "model/gpt_stage.hpp"
#include "model/param_layout.hpp"
#include "optim/optimizer.hpp"
#include "util/buffer.hpp"

namespace pt {

class Chunk {
public:
  // opt: AdamW, or ZeRO-1's AdamW (optim/zero_adamw.hpp), whose shard the reducer fills
  Chunk(std::unique_ptr<GptStage> stage, std::unique_ptr<Optimizer> opt);

  GptStage& stage() const { return *stage_; }
  Optimizer& optimizer() const { return *opt_; }
  // The data-parallel reduction of the gradients (all-reduce, or ZeRO-1's reduce-scatter into
  // the optimizer's shard), overlapped with the backward as comm.overlap says; null without
  // data parallelism.
  GradSync* reducer() const { return sync_.get(); }
  void set_reducer(std::unique_ptr<GradSync> sync) { sync_ = std::move(sync); }
  // Expert parallelism: the routed experts' gradients, reduced over the expert-data-parallel
  // group at finish_sum() (the reducer above then holds every other tensor)
  void set_expert_reducer(std::unique_ptr<GradSync> sync) { expert_sync_ = std::move(sync); }

  // The tensors the gradient norm counts (shards on every tp rank, replicated tensors on tp
  // rank 0: each element once), by their index in `whole`, the model in model order.
  void count_in_norm(const ParamLayout& whole);

  // The step's gradient work, in the order engine/step.cpp calls it. finish_sum(): the tied
  // head's share folded into the embedding, the dp all-reduce's buckets not started yet, and
  // with sequence parallelism the norms' tp sums. finish_shard(): ZeRO-1's reduce-scatter,
  // then the optimizer takes its sums (a copy on a GPU).
  void finish_sum(GradSyncStats& comm);
  void finish_shard(GradSyncStats& comm);
  // This rank's sum of squared gradients of each tensor it counts, added into sq (indexed by
  // the model's tensor order): whole optimizers count on dp rank 0 only (expert-parallel shards:
  // on the first ep dp ranks, one expert-parallel group), sharded ones everywhere.
  void add_norm_squares(double* sq, int dp_rank, int ep);
  void update(double lr, float grad_scale);
  // train.post_validation: save() keeps the parameters and optimizer state that undo() restores
  void save();
  void undo();

private:
  std::unique_ptr<GptStage> stage_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<GradSync> sync_, expert_sync_;
  // the norm's tensors: index in model order, offset and size in the optimizer's summed_grads()
  std::vector<std::size_t> norm_index_, norm_offset_, norm_size_;
  std::vector<char> norm_expert_; // the tensor is an expert-parallel shard
  std::vector<double> norm_sums_; // scratch: one sum of squares per tensor
  FloatBuffer saved_params_;      // post-validation: the parameters before the update
};

// The chunks' stages, for what reads or runs them without their optimizers (the pipeline engine,
// checkpoints, the final parameters' digests).
inline std::vector<GptStage*> stages_of(const std::vector<Chunk>& chunks) {
  std::vector<GptStage*> out;
  for (const Chunk& c : chunks) out.push_back(&c.stage());
  return out;
}

inline std::vector<Optimizer*> optimizers_of(const std::vector<Chunk>& chunks) {
  std::vector<Optimizer*> out;
  for (const Chunk& c : chunks) out.push_back(&c.optimizer());
  return out;
}

} // namespace pt
