#include "telemetry/trace.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "util/errors.hpp"

namespace pt {

void Trace::start_step(int step) {
  if (on(step) && t0_ < 0.0) t0_ = MPI_Wtime();
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

void Trace::write(const std::string& path, MPI_Comm world, int pp_rank) const {
  int rank = 0, size = 1;
  PT_MPI(MPI_Comm_rank(world, &rank));
  PT_MPI(MPI_Comm_size(world, &size));
  std::ostringstream mine;
  mine.precision(3);
  mine << std::fixed;
  name_track(mine, "thread_name", 0, rank,
             "rank " + std::to_string(rank) + " (pp " + std::to_string(pp_rank) + ")");
  for (const TraceEvent& e : events_) {
    event(mine, e.name, 0, rank, e.start, e.end, e.step, e.mb, e.chunk);
  }
  const std::string text = mine.str();
  int n = static_cast<int>(text.size());
  std::vector<int> sizes(static_cast<std::size_t>(size)), offsets(sizes.size(), 0);
  PT_MPI(MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, world));
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      offsets[r] = total;
      total += sizes[r];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  PT_MPI(MPI_Gatherv(text.data(), n, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR,
                     0, world));
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
