// log.trace (docs/design.md section 9): every rank's actions, waits, reductions and optimizer step
// over a range of steps, with micro-batch and chunk, as a Chrome trace (<log.dir>/trace.json, which
// Perfetto and chrome://tracing open; tools/timeline draws it). Beside the measured events, the
// simulator's prediction of the first traced step from that step's measured action costs.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "comm/watchdog.hpp"
#include "schedule/validate.hpp"

namespace pt {

struct TraceEvent {
  std::string name; // F, B, BI, BW, wait, dp reduction, optimizer
  double start = 0.0, end = 0.0;
  int step = 0; // 1-based
  int mb = -1, chunk = -1;
};

class Trace {
public:
  // Traces steps first..last (1-based, inclusive) when on.
  Trace(bool on, int first, int last) : on_(on), first_(first), last_(last) {}
  bool on(int step) const { return on_ && step + 1 >= first_ && step + 1 <= last_; }
  // Called at each step's start barrier (0-based step): the first traced step's sets time zero.
  void start_step(int step);
  void add(const std::string& name, double t0, double t1, int step, int mb = -1, int chunk = -1);
  // The prediction of the first traced step (the simulator's spans, per pipeline rank).
  void set_prediction(const std::vector<schedule::Span>& spans) { predicted_ = spans; }
  // Collective over world: gathers every rank's events; world rank 0 writes `path`.
  void write(const std::string& path, const Watchdog& watchdog, MPI_Comm world, int pp_rank) const;
  int first() const { return first_; }

private:
  bool on_;
  int first_, last_;
  double t0_ = -1.0;
  std::vector<TraceEvent> events_;
  std::vector<schedule::Span> predicted_;
};

} // namespace pt
