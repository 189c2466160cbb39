#include "comm/watchdog.hpp"

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "comm/group.hpp"
#include "util/clock.hpp"
#include "util/errors.hpp"

namespace pt {

const Watchdog& Watchdog::none() {
  static const Watchdog forever(0.0, 0);
  return forever;
}

double Watchdog::wait(MPI_Request& req, const std::string& what) const {
  if (timeout_s_ <= 0.0) {
    const double t0 = wall_time();
    PT_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE));
    return wall_time() - t0;
  }
  return wait_until(
      [&req] {
        int done = 0;
        PT_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        return done != 0;
      },
      what);
}

double Watchdog::wait_until(const std::function<bool()>& done, const std::string& what) const {
  const double t0 = wall_time();
  long polls = 0;
  while (!done()) {
    const double waited = wall_time() - t0;
    if (timeout_s_ > 0.0 && waited > timeout_s_) hang(waited, what);
    // spin briefly, then yield the core (oversubscribed test machines)
    if (++polls > 1000) std::this_thread::yield();
  }
  return wall_time() - t0;
}

void Watchdog::hang(double waited, const std::string& what) const {
  std::fprintf(stderr,
               "pipetrain: error: rank %d waited %.1f s (runtime.hang_timeout_s = %g) for %s; "
               "aborting the job.\n---> HINT: the peer may have died or be stuck; its own "
               "message (if any) names what it waits for\n",
               rank_, waited, timeout_s_, what.c_str());
  std::fflush(stderr);
  abort_job(ExitCode::hang);
}

Watchdog::Scope::Scope(const Watchdog& w, std::string what)
    : w_(w), what_(std::move(what)), since_(wall_time()) {
  if (w_.timeout_s_ <= 0.0) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      const double waited = wall_time() - since_;
      if (waited > w_.timeout_s_) w_.hang(waited, what_); // MPI_THREAD_MULTIPLE: main() asks it
      cv_.wait_for(lock, std::chrono::duration<double>(w_.timeout_s_ - waited + 0.05));
    }
  });
}

void Watchdog::Scope::now(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  what_ = std::move(what);
  since_ = wall_time();
}

Watchdog::Scope::~Scope() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

double Watchdog::allreduce(void* buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                           const std::string& what) const {
  count_collective();
  if (timeout_s_ <= 0.0) {
    const double t0 = wall_time();
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, count, type, op, comm));
    return wall_time() - t0;
  }
  MPI_Request req;
  PT_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, comm, &req));
  return wait(req, what);
}

MPI_Request Watchdog::start_allreduce(void* buf, int count, MPI_Datatype type, MPI_Op op,
                                      MPI_Comm comm) const {
  count_collective();
  MPI_Request req;
  PT_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, comm, &req));
  return req;
}

double Watchdog::bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
                       const std::string& what) const {
  count_collective();
  if (timeout_s_ <= 0.0) {
    const double t0 = wall_time();
    PT_MPI(MPI_Bcast(buf, count, type, root, comm));
    return wall_time() - t0;
  }
  MPI_Request req;
  PT_MPI(MPI_Ibcast(buf, count, type, root, comm, &req));
  return wait(req, what);
}

double Watchdog::barrier(MPI_Comm comm, const std::string& what) const {
  count_collective();
  if (timeout_s_ <= 0.0) {
    const double t0 = wall_time();
    PT_MPI(MPI_Barrier(comm));
    return wall_time() - t0;
  }
  MPI_Request req;
  PT_MPI(MPI_Ibarrier(comm, &req));
  return wait(req, what);
}

double Watchdog::allgather(const void* mine, int count, MPI_Datatype type, void* all, MPI_Comm comm,
                           const std::string& what) const {
  count_collective();
  MPI_Request req;
  PT_MPI(MPI_Iallgather(mine, count, type, all, count, type, comm, &req));
  return wait(req, what);
}

void Watchdog::broadcast_text(std::string& text, int root, MPI_Comm comm,
                              const std::string& what) const {
  long long len = static_cast<long long>(text.size());
  bcast(&len, 1, MPI_LONG_LONG, root, comm, what);
  text.resize(static_cast<std::size_t>(len));
  bcast(text.data(), static_cast<int>(len), MPI_CHAR, root, comm, what);
}

std::string Watchdog::gather_text(const std::string& mine, int root, MPI_Comm comm,
                                  const std::string& what) const {
  const int rank = rank_in(comm), size = size_of(comm);
  int n = static_cast<int>(mine.size());
  std::vector<int> sizes(static_cast<std::size_t>(size)), offsets(sizes.size(), 0);
  count_collective();
  MPI_Request req;
  PT_MPI(MPI_Igather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, comm, &req));
  wait(req, what);
  std::string all;
  if (rank == root) {
    int total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      offsets[r] = total;
      total += sizes[r];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  count_collective();
  PT_MPI(MPI_Igatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR,
                      root, comm, &req));
  wait(req, what);
  return all;
}

void Watchdog::agree(MPI_Comm comm, const std::optional<Error>& local,
                     const std::string& what) const {
  const int rank = rank_in(comm), size = size_of(comm);
  int first = local ? rank : size;
  allreduce(&first, 1, MPI_INT, MPI_MIN, comm, what);
  if (first == size) return;

  int header[2] = {0, 0}; // exit code, message length
  std::string text;
  if (rank == first) {
    text = local->what();
    header[0] = static_cast<int>(local->code());
    header[1] = static_cast<int>(text.size());
  }
  bcast(header, 2, MPI_INT, first, comm, what);
  text.resize(static_cast<std::size_t>(header[1]));
  bcast(text.data(), header[1], MPI_CHAR, first, comm, what);
  throw Error(static_cast<ExitCode>(header[0]), text);
}

} // namespace pt
