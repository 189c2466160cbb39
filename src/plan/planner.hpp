// `pipetrain plan` (docs/design.md section 10): every layout of the deck's model on N ranks, its
// predicted memory per rank (the memory model) and step time (a compute and network model fed to
// the schedule simulator), best first. One process, no device, nothing big allocated.
#pragma once

#include <string>
#include <vector>

namespace pt {

// A machine file (inputs/machines/*.toml, docs/planner.md): one rank's compute and memory and
// the network between ranks.
struct Machine {
  std::string name;
  double peak_flops = 0.0; // per rank, at the training precision
  double efficiency = 0.5; // fraction of the peak the model's matrix products reach
  double memory_bytes = 0; // per rank
  int ranks_per_node = 1;
  double intra_bw = 0.0, intra_latency = 0.0; // bytes/s and s, between ranks of a node
  double inter_bw = 0.0, inter_latency = 0.0; // per rank, across nodes
};

// Reads a machine file; throws pt::Error(bad_input) naming the file and key on a bad one.
Machine read_machine(const std::string& path);

struct Candidate {
  int pp = 1, dp = 1, tp = 1, v = 1, micro_batch = 1, zero = 0;
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

// `pipetrain plan ...` (argv after "plan"); returns the exit code.
int plan_main(int argc, char** argv);

} // namespace pt
