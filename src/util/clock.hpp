// Wall-clock seconds from a steady clock, for step times, traces and timeouts on one rank (times
// of different ranks are compared only as durations).
#pragma once

#include <chrono>

namespace pt {

inline double wall_time() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace pt
