// What every rank derives from the deck before training (docs/design.md section 10's plan/): the
// partition, the schedule and its validation, the memory model's estimate; and the printout.
#pragma once

#include <string>
#include <vector>

#include "comm/layout.hpp"
#include "config/run_config.hpp"
#include "model/partition.hpp"
#include "plan/memory.hpp"
#include "schedule/schedule.hpp"
#include "schedule/validate.hpp"

namespace pt {

// 6 N + 6 L C T: the matrix products of forward and backward per token (PaLM's MFU count); N:
// the parameters a token passes through (an MoE layer's top_k of its routed experts), without an
// untied input embedding (a lookup).
double flops_per_token(const ModelConfig& m);

// What every rank derives from the deck before training: the partition and the schedule.
struct Plan {
  BlockCosts costs;
  std::string cost_unit;
  std::vector<int> layers; // per virtual stage
  schedule::Schedule schedule;
  std::vector<int> peak_live;         // per pp rank, from the validator
  schedule::Simulation predicted;     // with T_F = 1, T_B = 2 (for the plan printout)
  std::vector<MemoryEstimate> memory; // per pp rank (plan/memory.hpp)
  double memory_limit = 0.0;          // bytes this rank may use
  std::string memory_source;          // where that limit comes from
};

// Collective (partition = "time" profiles on every rank when `profile`). Throws
// pt::Error(bad_input) when the schedule does not suit (pp, micro-batches, virtual stages).
Plan make_plan(const RunConfig& cfg, const Layout& layout, bool profile);
// The deck's schedule: built, read from its file (parallel.schedule = "file:PATH") or searched
// for these stage costs (one per pipeline rank; "search"), with its messages. Throws the input
// error (exit 2) naming the key and the cause where it does not fit. search_tries: the search's
// local improvement tries (schedule::search_schedule).
schedule::Schedule run_schedule(const RunConfig& cfg, const std::vector<double>& stage_cost,
                                int search_tries = 2000);

// Prints the resolved deck, layout table, partition and plan on rank 0 (--validate too).
void print_plan(const RunConfig& cfg, const Layout& layout, const Placement& placement,
                const Plan& plan);

} // namespace pt
