// Per-op timing of a backend (deck: log.op_profile). The profiled table has the inner
// backend's memory and ops, with copy() timed as one more op. Where the inner backend has
// markers (a GPU: Backend::mark), each op is bracketed by two markers in the stream and nothing
// waits: the times are read when the stream is next synchronized, so each total is the op's
// time on the device (from the end of the work before it to its own end) and the run keeps its
// speed. On the host each op is timed with the steady clock. The numbers are unchanged: the
// same ops run in the same order.
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
// Every op of the table, in PT_BACKEND_OPS order, then copy, with its totals so far (waits for
// the inner backend).
std::vector<OpTime> op_times();
// Sets every total back to zero (the trainer does, as its first step starts).
void reset_op_times();

} // namespace pt
