#include "comm/watchdog.hpp"

#include <cstdio>
#include <thread>

#include "util/errors.hpp"

namespace pt {

const Watchdog& Watchdog::none() {
  static const Watchdog forever(0.0, 0);
  return forever;
}

double Watchdog::wait(MPI_Request& req, const std::string& what) const {
  if (timeout_s_ <= 0.0) {
    const double t0 = MPI_Wtime();
    PT_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE));
    return MPI_Wtime() - t0;
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
  const double t0 = MPI_Wtime();
  long polls = 0;
  while (!done()) {
    const double waited = MPI_Wtime() - t0;
    if (timeout_s_ > 0.0 && waited > timeout_s_) {
      std::fprintf(stderr,
                   "pipetrain: error: rank %d waited %.1f s (runtime.hang_timeout_s = %g) for %s; "
                   "aborting the job.\n---> HINT: the peer may have died or be stuck; its own "
                   "message (if any) names what it waits for\n",
                   rank_, waited, timeout_s_, what.c_str());
      std::fflush(stderr);
      abort_job(ExitCode::hang);
    }
    // spin briefly, then yield the core (oversubscribed test machines)
    if (++polls > 1000) std::this_thread::yield();
  }
  return MPI_Wtime() - t0;
}

double Watchdog::allreduce(void* buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                           const std::string& what) const {
  count_collective();
  if (timeout_s_ <= 0.0) {
    const double t0 = MPI_Wtime();
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, count, type, op, comm));
    return MPI_Wtime() - t0;
  }
  MPI_Request req;
  PT_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, comm, &req));
  return wait(req, what);
}

double Watchdog::bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
                       const std::string& what) const {
  count_collective();
  if (timeout_s_ <= 0.0) {
    const double t0 = MPI_Wtime();
    PT_MPI(MPI_Bcast(buf, count, type, root, comm));
    return MPI_Wtime() - t0;
  }
  MPI_Request req;
  PT_MPI(MPI_Ibcast(buf, count, type, root, comm, &req));
  return wait(req, what);
}

double Watchdog::barrier(MPI_Comm comm, const std::string& what) const {
  count_collective();
  if (timeout_s_ <= 0.0) {
    const double t0 = MPI_Wtime();
    PT_MPI(MPI_Barrier(comm));
    return MPI_Wtime() - t0;
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

} // namespace pt
