// Validator and simulator of schedules (docs/design.md section 6).
//
// Execution model, the one the engine implements: a SEND never blocks (MPI_Isend), a RECV waits
// until the peer has issued the matching SEND (the engine posts each receive by its RECV).
// So a schedule is deadlock-free exactly when replaying all ranks' lists under that rule ends
// with every list done.
#pragma once

#include <string>
#include <vector>

#include "schedule/schedule.hpp"

namespace pt::schedule {

struct Validation {
  bool ok = false;
  std::string error;          // first problem found, naming rank, action index and action
  std::vector<int> peak_live; // per rank: most micro-batch activations alive at once (F..B/BW)
};

// Proves: every RECV has a SEND with the same (direction, micro-batch, stage) on the right peer
// and vice versa; each (micro-batch, stage) has exactly one F and one B (or BI then BW) on the
// rank that owns the stage; inputs exist before use (F after its activation arrives, B after its
// F and its output gradient); no cycle of waits (the message lists the cycle).
Validation validate(const Schedule& s);

struct Costs {
  double f = 1.0;    // forward of one chunk of one micro-batch
  double b = 2.0;    // full backward (used by B)
  double bi = 1.0;   // input-gradient half (BI)
  double bw = 1.0;   // weight-gradient half (BW)
  double comm = 0.0; // latency of one SEND -> RECV
};

// A stage whose forward and backward take `c` in all: F, BI and BW a third each (B two thirds),
// messages free (what schedule search and `pipetrain schedule --stage-costs` assume).
inline Costs split_stage_cost(double c) {
  return {c / 3, 2 * c / 3, c / 3, c / 3, 0.0};
}

// One compute action as the simulator placed it.
struct Span {
  int rank;
  Op op;
  int mb, chunk;
  double start, end;
};

struct Simulation {
  double step_time = 0.0;
  std::vector<Span> spans;    // every F, B, BI and BW
  std::vector<double> busy;   // per rank: compute time
  std::vector<double> bubble; // per rank: 1 - busy / step_time (idle fraction, definition B)
  double mean_bubble = 0.0;
  std::vector<double> step_ends; // 2bw's unrolled lists: when each STEP's barrier opened
};

// The idle fraction of one step: the mean bubble, or for 2bw's unrolled lists (step_ends) that of
// the steady middle step, where each rank does a third of its work.
double step_bubble(const Simulation& sim);

// Replays a valid schedule with these costs (SEND/RECV take no rank time; a message arrives
// `comm` after its SEND). Throws std::invalid_argument for an invalid schedule.
Simulation simulate(const Schedule& s, const Costs& c);
// The same with costs per rank (stages differ: the first holds the embedding, the last the head).
Simulation simulate(const Schedule& s, const std::vector<Costs>& per_rank);

} // namespace pt::schedule
