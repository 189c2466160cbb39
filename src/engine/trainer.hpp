// Runs training for a validated RunConfig on a Layout: pipeline stages per rank, the schedule's
// action lists executed by PipelineEngine, gradient reductions, clipping, AdamW, metrics.
#pragma once

#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "engine/memory.hpp"
#include "model/partition.hpp"
#include "parallel/layout.hpp"
#include "schedule/schedule.hpp"
#include "schedule/validate.hpp"

namespace pt {

// What every rank derives from the deck before training: the partition and the schedule.
struct Plan {
  BlockCosts costs;
  std::string cost_unit;
  std::vector<int> layers; // per virtual stage
  schedule::Schedule schedule;
  std::vector<int> peak_live;         // per pp rank, from the validator
  schedule::Simulation predicted;     // with T_F = 1, T_B = 2 (for the plan printout)
  std::vector<MemoryEstimate> memory; // per pp rank (engine/memory.hpp)
  double memory_limit = 0.0;          // bytes this rank may use
  std::string memory_source;          // where that limit comes from
};

// Collective (partition = "time" profiles on every rank when `profile`). Throws
// pt::Error(bad_input) when the schedule does not suit (pp, micro-batches, virtual stages).
Plan make_plan(const RunConfig& cfg, const Layout& layout, bool profile);

// Prints the resolved deck, layout table, partition and plan on rank 0 (--validate too).
void print_plan(const RunConfig& cfg, const Layout& layout, const Plan& plan);

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
