// A planner machine file (inputs/machines/*.toml, docs/planner.md): one rank's compute, memory
// and the network between ranks, as `pipetrain plan` models them.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pt {

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

} // namespace pt
