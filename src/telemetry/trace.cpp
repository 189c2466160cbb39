#include "telemetry/trace.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "comm/group.hpp"
#include "util/clock.hpp"
#include "util/errors.hpp"

namespace pt {

void Trace::start_step(int step) {
  if (on(step) && t0_ < 0.0) t0_ = wall_time();
}

void Trace::add(const std::string& name, double t0, double t1, int step, int mb, int chunk) {
  if (!on(step) || t0_ < 0.0) return;
  events_.push_back({name, t0 - t0_, t1 - t0_, step + 1, mb, chunk});
}

namespace {

// One complete event ("ph": "X"), times in microseconds.
void event(std::ostringstream& os, const std::string& name, int pid, int tid, double start,
           double end, int step, int mb, int chunk) {
  os << "{\"name\": \"" << name << "\", \"ph\": \"X\", \"pid\": " << pid << ", \"tid\": " << tid
     << ", \"ts\": " << start * 1e6 << ", \"dur\": " << (end - start) * 1e6
     << ", \"args\": {\"step\": " << step << ", \"mb\": " << mb << ", \"chunk\": " << chunk
     << "}},\n";
}

void name_track(std::ostringstream& os, const char* what, int pid, int tid, const std::string& n) {
  os << "{\"name\": \"" << what << "\", \"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << tid
     << ", \"args\": {\"name\": \"" << n << "\"}},\n";
}

} // namespace

void Trace::write(const std::string& path, const Watchdog& watchdog, MPI_Comm world,
                  int pp_rank) const {
  const int rank = rank_in(world);
  std::ostringstream mine;
  mine.precision(3);
  mine << std::fixed;
  name_track(mine, "thread_name", 0, rank,
             "rank " + std::to_string(rank) + " (pp " + std::to_string(pp_rank) + ")");
  for (const TraceEvent& e : events_) {
    event(mine, e.name, 0, rank, e.start, e.end, e.step, e.mb, e.chunk);
  }
  const std::string all = watchdog.gather_text(mine.str(), 0, world, "the trace's gather");
  if (rank != 0) return;
  std::ostringstream os;
  os.precision(3);
  os << std::fixed;
  os << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  name_track(os, "process_name", 0, 0, "measured");
  name_track(os, "process_name", 1, 0, "predicted (simulator, first traced step)");
  os << all;
  int ranks = 0;
  for (const schedule::Span& s : predicted_) ranks = std::max(ranks, s.rank + 1);
  for (int r = 0; r < ranks; ++r) name_track(os, "thread_name", 1, r, "pp " + std::to_string(r));
  for (const schedule::Span& s : predicted_) {
    event(os, schedule::op_name(s.op), 1, s.rank, s.start, s.end, first_, s.mb, s.chunk);
  }
  std::string out = os.str();
  out.erase(out.size() - 2); // the last ",\n"
  out += "\n]}\n";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || std::fwrite(out.data(), 1, out.size(), f) != out.size()) {
    if (f != nullptr) std::fclose(f);
    std::fprintf(stderr, "pipetrain: warning: log.trace: could not write %s\n", path.c_str());
    return;
  }
  std::fclose(f);
  std::printf("trace of steps %d-%d -> %s (tools/timeline draws it)\n", first_, last_,
              path.c_str());
  std::fflush(stdout);
}

} // namespace pt
