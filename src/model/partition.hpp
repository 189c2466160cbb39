// Partition of the model's blocks into virtual stages (docs/design.md section 4,
// parallel.partition). Blocks: the embedding (on stage 0), the transformer layers, the final norm +
// head + loss (on the last stage). Each stage gets at least one layer.
#pragma once

#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "model/param_layout.hpp"

namespace pt {

struct BlockCosts {
  double embedding = 0.0; // cost of the embedding block (on the first stage)
  double layer = 1.0;     // cost of one transformer layer
  double head = 0.0;      // cost of final norm + head + loss (on the last stage)
};

// Parameter counts as costs (partition = "params").
BlockCosts parameter_costs(const ModelConfig& m);

// Layer counts per virtual stage (stages entries, sum n_layer).
// uniform: n_layer / stages each, the remainder to the middle stages (the edge stages carry the
// embedding and the head). params / time: contiguous split minimizing the most expensive stage,
// counting embedding and head costs. explicit: the deck's list.
std::vector<int> partition_layers(const ParallelConfig& p, int n_layer, int stages,
                                  const BlockCosts& costs);

// The StageSpec of virtual stage `stage` under those counts.
StageSpec stage_spec(const std::vector<int>& counts, int stage);

// Cost of each stage under a partition (for reports).
std::vector<double> stage_costs(const std::vector<int>& counts, const BlockCosts& costs);

} // namespace pt
