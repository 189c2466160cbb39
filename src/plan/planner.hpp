// `pipetrain plan` (docs/design.md section 10): every layout of the deck's model on N ranks, its
// predicted memory per rank (the memory model) and step time (a compute and network model fed to
// the schedule simulator), best first. One process, no device, nothing big allocated.
#pragma once

#include <string>
#include <vector>

#include "plan/machine.hpp"

namespace pt {

struct Candidate {
  int pp = 1, dp = 1, tp = 1, v = 1, micro_batch = 1, zero = 0;
  int ep = 1;      // parallel.ep: experts over blocks of ep dp ranks (MoE models)
  int threads = 0; // device.threads, where the planner chose it (--cores-per-node); else 0
  std::string schedule, recompute;
  bool sp = false;
  double step_time_s = 0.0, tokens_per_s = 0.0, tflops_per_rank = 0.0, mfu = 0.0, bubble = 0.0;
  double mem_bytes_per_rank = 0.0;
  bool fits = false;
  std::vector<std::string> overrides() const; // the deck overrides that select it
};

// Every valid layout of the deck (with `overrides` fixing keys) on `ranks` ranks, ranked: those
// that fit first, by predicted step time. `with_search` adds schedule "search" to the schedules
// tried where pp > 1.
std::vector<Candidate> plan_layouts(const std::string& deck_text, const std::string& deck_path,
                                    const std::vector<std::string>& overrides, int ranks,
                                    const Machine& machine, bool with_search = false);
// The same over every ranks x threads split of `nodes` nodes of `cores` cores each: t threads a
// rank for each t dividing cores (or device.threads where the overrides fix it), nodes * cores / t
// ranks, the machine as Machine::with_threads(t, cores) describes it.
std::vector<Candidate> plan_hybrid(const std::string& deck_text, const std::string& deck_path,
                                   const std::vector<std::string>& overrides, int nodes, int cores,
                                   const Machine& machine, bool with_search = false);

// `pipetrain plan ...` (argv after "plan"); returns the exit code.
int plan_main(int argc, char** argv);

} // namespace pt
