// Waiting on MPI requests with the hang watchdog of runtime.hang_timeout_s (docs/design.md section
// 3): a rank that waits longer prints what it waited for (action, peer, micro-batch) and aborts the
// job with exit code 5.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "util/errors.hpp"

namespace pt {

class Watchdog {
public:
  // timeout_s <= 0: wait forever (plain MPI_Wait).
  Watchdog(double timeout_s, int world_rank) : timeout_s_(timeout_s), rank_(world_rank) {}
  // A watchdog that waits forever: plain blocking MPI (benchmarks, tests).
  static const Watchdog& none();

  // Waits for req; `what` describes the wait ("RECV_ACT(mb 3, chunk 0) from pipeline rank 1").
  // Returns the seconds spent waiting.
  double wait(MPI_Request& req, const std::string& what) const;

  // Polls done() until it returns true, under the same timeout: for waits that are not MPI
  // requests (an NCCL transfer's CUDA event). Returns the seconds spent waiting.
  double wait_until(const std::function<bool()>& done, const std::string& what) const;

  // MPI_Allreduce (in place) under the watchdog.
  double allreduce(void* buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   const std::string& what) const;

  // A non-blocking in-place MPI_Allreduce, counted as a collective: wait() for its request.
  MPI_Request start_allreduce(void* buf, int count, MPI_Datatype type, MPI_Op op,
                              MPI_Comm comm) const;

  // MPI_Bcast and MPI_Barrier under the watchdog.
  double bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
               const std::string& what) const;
  double barrier(MPI_Comm comm, const std::string& what) const;
  // MPI_Allgather under the watchdog: every rank's mine[0, count) into all[0, count * size).
  double allgather(const void* mine, int count, MPI_Datatype type, void* all, MPI_Comm comm,
                   const std::string& what) const;

  // Text from one rank to all (the deck, a list of files): `text` is root's on return.
  void broadcast_text(std::string& text, int root, MPI_Comm comm, const std::string& what) const;
  // Every rank's text, concatenated in rank order, on root (empty elsewhere).
  std::string gather_text(const std::string& mine, int root, MPI_Comm comm,
                          const std::string& what) const;

  // Collective: if any rank passes an error, the one of the lowest such rank is thrown on every
  // rank (util/errors.hpp's agree() is this without a timeout).
  void agree(MPI_Comm comm, const std::optional<Error>& local, const std::string& what) const;

  // The collectives this rank has started: allreduce, bcast and barrier above count themselves;
  // a collective started elsewhere in comm/ (a non-blocking one it waits on with wait(), or one
  // of comm/allreduce.hpp's algorithms) calls count_collective() once. Read per step by the
  // trainer to report how many collectives a step makes (atomic: comm.overlap's thread).
  void count_collective() const { collectives_.fetch_add(1, std::memory_order_relaxed); }
  long collectives() const { return collectives_.load(std::memory_order_relaxed); }

  // Watches blocking calls that cannot be polled (HDF5's collective MPI-IO): while the scope is
  // open, a second thread aborts the job with exit 5, naming the call, if one call set by now()
  // has not returned within the timeout. Nothing runs when the timeout is 0.
  class Scope {
  public:
    Scope(const Watchdog& w, std::string what);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    // The call about to block (its clock starts now).
    void now(std::string what);

  private:
    const Watchdog& w_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::string what_;
    double since_ = 0.0;
    bool done_ = false;
    std::thread thread_;
  };

private:
  [[noreturn]] void hang(double waited, const std::string& what) const;
  double timeout_s_;
  int rank_;
  mutable std::atomic<long> collectives_{0};
};

} // namespace pt
