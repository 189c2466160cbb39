// How optimizer steps follow one another, chosen once from the schedule kind at setup
// (docs/design.md section 6), so that nothing else asks which schedule runs:
//   synchronous  every step runs the plan's list for its own micro-batches, drains, and the
//                update follows; micro-batches compute with GptStage::params()
//   2bw          PipeDream-2BW: a step's list reaches into the next step's forwards unless it
//                drains (before a checkpoint, a validation, a stop and the last step); the
//                micro-batches still in flight compute with the weights one version older,
//                which the policy keeps, and which checkpoints save as /model_prev
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "model/gpt_stage.hpp"
#include "schedule/schedule.hpp"
#include "util/buffer.hpp"

namespace pt {

class StepPolicy {
public:
  virtual ~StepPolicy() = default;

  // The list this rank runs for optimizer step `step`; drain: it ends with the cool-down (a
  // synchronous step always does).
  virtual const std::vector<schedule::Action>& list(int step, bool drain) = 0;
  // Every list a step may run (the engine sizes its message buffers from them).
  virtual std::vector<const std::vector<schedule::Action>*> lists() const = 0;
  // (optimizer step, micro-batch within it) of micro-batch id `mb` of step `step`'s list.
  virtual std::pair<int, int> step_of(int step, int mb) const = 0;
  // The weights chunk `chunk` computes a micro-batch of optimizer step `step` with; null: its
  // params().
  virtual float* weights_for(int chunk, int step) = 0;
  // Whether a stop signal is agreed before the step (which then drains) instead of in the
  // step's own world sum.
  virtual bool stops_before_step() const = 0;
  // Just before the optimizer's update of the chunks' stages.
  virtual void before_update(const std::vector<GptStage*>& stages) = 0;
  // The weights a checkpoint saves besides the parameters (/model_prev, per chunk), or null.
  virtual std::vector<FloatBuffer>* older_weights() = 0;
  // After a resume: params() hold the weights after `step` updates.
  virtual void resumed_at(int step) = 0;
};

// The policy of cfg's schedule for pipeline rank `me` of `plan` (its list), over the rank's
// chunks' stages.
std::unique_ptr<StepPolicy> make_step_policy(const RunConfig& cfg, const schedule::Schedule& plan,
                                             int me, const std::vector<GptStage*>& stages,
                                             const Backend& be);

} // namespace pt
