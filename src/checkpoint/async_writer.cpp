#include "checkpoint/async_writer.hpp"

#include <cstdio>
#include <utility>

#include "comm/group.hpp"
#include "util/clock.hpp"
#include "util/errors.hpp"

namespace pt {

AsyncWriter::AsyncWriter(const Layout& layout, double hang_timeout_s)
    : layout_(layout), watchdog_(hang_timeout_s, layout.rank()) {
  if (thread_level() < MPI_THREAD_MULTIPLE) { // the same answer on every rank
    throw input_error("checkpoint.async = true writes from a thread of its own while training "
                      "runs MPI, which needs MPI_THREAD_MULTIPLE; this MPI library provides "
                      "level " +
                      std::to_string(thread_level()) +
                      ".\n---> HINT: use checkpoint.async = false, or an MPI built with thread "
                      "support");
  }
  comm_ = duplicate(layout.world());
}

AsyncWriter::~AsyncWriter() {
  if (thread_.joinable()) thread_.join();
  free_comm(comm_);
}

void AsyncWriter::prepare(const RunConfig& cfg, const Shards& shards) {
  take_snapshot(cfg.model, layout_, shards, snapshot_);
}

void AsyncWriter::start(const RunConfig& cfg, Shards shards, const std::vector<int>& partition,
                        const TrainState& state) {
  wait();
  const double t0 = wall_time();
  take_snapshot(cfg.model, layout_, shards, snapshot_);
  copy_s_ = wall_time() - t0;
  shards.snapshot = &snapshot_;
  started_ = wall_time();
  thread_ = std::thread([this, &cfg, shards, &partition, state] {
    try {
      path_ = write_checkpoint(cfg, layout_, watchdog_, shards, partition, state, comm_, true);
    } catch (...) {
      error_ = std::current_exception();
    }
    write_s_ = wall_time() - started_;
  });
}

void AsyncWriter::wait() {
  if (!thread_.joinable()) return;
  const double t0 = wall_time();
  thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  if (layout_.rank() == 0) {
    std::printf("checkpoint %s written in %.2f s (asynchronously: training stalled %.3f s for the "
                "copy, and %.3f s waiting for the write)\n",
                path_.c_str(), write_s_, copy_s_, wall_time() - t0);
    std::fflush(stdout);
  }
}

} // namespace pt
