// One pipeline chunk of this rank (virtual stage plan.schedule.stage_of(pp rank, c)): the stage
// it computes, the optimizer that updates it and the data-parallel reduction of its gradients,
// made together at setup (engine/setup.cpp) and used together by the step (engine/step.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/grad_sync.hpp"
#include "model/gpt_stage.hpp"
#include "optim/optimizer.hpp"
#include "util/buffer.hpp"

namespace pt {

// The tensors a chunk's gradient norm counts (shards on every tp rank, replicated tensors on tp
// rank 0: each element once): their index in model order, offset and size in the optimizer's
// summed_grads().
struct NormTensors {
  std::vector<std::size_t> index, offset, size;
  std::vector<double> sums; // scratch: one sum of squares per tensor
};

struct Chunk {
  std::unique_ptr<GptStage> stage;
  // AdamW, or ZeRO-1's AdamW (optim/zero_adamw.hpp), which reduces the gradients over dp itself
  std::unique_ptr<Optimizer> opt;
  // the dp all-reduce of the gradients, overlapped with the backward (comm.overlap); null
  // without data parallelism or under ZeRO-1
  std::unique_ptr<GradSync> sync;
  NormTensors norm;
  FloatBuffer saved_params; // train.post_validation: the parameters before the update
};

// The chunks' stages, for what reads or runs them without their optimizers (the pipeline engine,
// checkpoints, the final parameters' digests).
inline std::vector<GptStage*> stages_of(const std::vector<Chunk>& chunks) {
  std::vector<GptStage*> out;
  for (const Chunk& c : chunks) out.push_back(c.stage.get());
  return out;
}

inline std::vector<Optimizer*> optimizers_of(const std::vector<Chunk>& chunks) {
  std::vector<Optimizer*> out;
  for (const Chunk& c : chunks) out.push_back(c.opt.get());
  return out;
}

} // namespace pt
