// Per-op timing of a backend (deck: log.op_profile). The profiled table has the inner
// backend's memory, copies and ops; each op first waits for the inner backend's queue, then
// runs and waits again, and the steady-clock time between is added to the op's total. On the
// host the waits cost nothing; on a GPU they drain the stream around every op, so the totals
// are each op's own time plus its launch latency, and the run is slower than an unprofiled
// one (small ops most). The numbers are unchanged: the same ops run in the same order.
#pragma once

#include <vector>

#include "backend.hpp"

namespace pt {

struct OpTime {
  const char* name;
  long long calls;
  double seconds;
};

// The profiling table over `inner` (one inner per process: the first call's).
const Backend& profiled_backend(const Backend& inner);
// Every op of the table, in PT_BACKEND_OPS order, with its totals so far.
std::vector<OpTime> op_times();
// Sets every total back to zero (the trainer does, as its first step starts).
void reset_op_times();

} // namespace pt
