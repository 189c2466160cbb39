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
  // the share of the isolated rates (the peak or the gemm table, the attention core's, the
  // memory bandwidth) a training step sustains
  double efficiency = 0.5;
  double memory_bytes = 0; // per rank
  int ranks_per_node = 1;
  double intra_bw = 0.0, intra_latency = 0.0; // bytes/s and s, between ranks of a node
  double inter_bw = 0.0, inter_latency = 0.0; // per rank, across nodes
  // machine.gemm: measured or published rates of matrix products (m x k times k x n) by shape,
  // in FLOP/s; empty: every product at peak_flops * efficiency
  struct GemmRate {
    double m, n, k, flops;
  };
  std::vector<GemmRate> gemm;
  double attention_efficiency = 1.0; // the attention core's rate in isolation, over the peak
  double memory_bw = 0.0;            // bytes/s of element-wise passes in isolation; 0: not counted
  bool gpu = false; // machine.device = "cuda": ranks are GPUs, planned as the CUDA backend runs
  // machine.attention = "fused": the attention core never writes its B NH T^2 scores to memory
  // (flash-style kernels); "unfused": they make memory passes at memory_bw
  bool fused_attention = false;

  // FLOP/s a training step sustains in an (m, n, k) product: efficiency times the table
  // interpolated in log2(m, n, k) at the shape clamped into the table's range, capped by the
  // memory roofline of bf16 operands where memory_bw is set; without a table, efficiency times
  // the peak.
  double gemm_rate(double m, double n, double k) const;
  // machine.thread_speedup: (threads, a rank's sustained rate over one thread's), ascending;
  // {1, 1} alone where the file has none
  std::vector<std::pair<int, double>> thread_speedup{{1, 1.0}};

  // The speedup at t threads: interpolated in the table; past its end each further thread adds
  // what one thread of its last entry does.
  double speedup(int t) const;
  // One rank of t threads on a node of `cores` cores, the file's ranks being one per core: the
  // node's memory and cores shared by cores / t such ranks, each sustaining speedup(t) times one
  // core's rate (peak counted as t cores').
  Machine with_threads(int t, int cores) const;
};

// Reads a machine file; throws pt::Error(bad_input) naming the file and key on a bad one.
Machine read_machine(const std::string& path);

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
