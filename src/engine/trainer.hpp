// Runs training for a validated RunConfig on a Layout: pipeline stages per rank, the schedule's
// action lists executed by PipelineEngine, gradient reductions, clipping, AdamW, metrics.
#pragma once

#include <string>
#include <vector>

#include "comm/layout.hpp"
#include "config/run_config.hpp"
#include "plan/plan.hpp"

namespace pt {

struct TrainResult {
  int steps_done = 0;
  double final_loss = 0.0;
  double mean_tokens_per_s = 0.0; // over steps after the first
  bool stopped_early = false;     // runtime.exit_after_steps or a stop signal
  bool nothing_to_do = false;     // resumed at or past train.steps: no step ran
};

// Collective over layout.world(). Throws pt::Error (bad input, non-finite loss).
TrainResult train(const RunConfig& cfg, const Layout& layout, const Plan& plan);

} // namespace pt
