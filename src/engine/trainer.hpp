// Runs training for a validated RunConfig on a Layout. Today one stage per rank (pp = 1):
// gradient accumulation over micro-batches, data-parallel all-reduce, clipping, AdamW.
#pragma once

#include "config/run_config.hpp"
#include "parallel/layout.hpp"

namespace pt {

struct TrainResult {
  int steps_done = 0;
  double final_loss = 0.0;
  double mean_tokens_per_s = 0.0; // over steps after the first
};

// Collective over layout.world(). Throws pt::Error (bad input, non-finite loss).
TrainResult train(const RunConfig& cfg, const Layout& layout);

// Prints the run plan (model size, batch, stage partition) on rank 0; used by --validate too.
void print_plan(const RunConfig& cfg, const Layout& layout);

} // namespace pt
