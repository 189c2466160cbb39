// checkpoint.async (docs/checkpoints.md): checkpoints that do not stop training. At a checkpoint
// step every rank copies what it will write into host memory (take_snapshot), and a writer
// thread writes that copy with write_checkpoint (the same file, checksums and atomic publish) on
// a duplicate of the world communicator, under a watchdog of its own, while the main thread
// trains on (the writer drops to the lowest CPU priority once the datasets are created). One save
// is in flight at a time: the next save, the end of the run and the destructor wait for it first.
// The main thread makes no HDF5 call while a save is in flight (HDF5 is not built thread-safe),
// and MPI runs at MPI_THREAD_MULTIPLE (main() asks for it).
#pragma once

#include <mpi.h>

#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace pt {

class AsyncWriter {
public:
  // Collective over layout.world() (duplicates it). hang_timeout_s: the writer's watchdog's.
  // Throws pt::Error(bad_input) on every rank when MPI gives less than MPI_THREAD_MULTIPLE.
  AsyncWriter(const Layout& layout, double hang_timeout_s);
  // Waits for the save in flight (its error, if any, is dropped: the run is already ending on
  // another), then frees the communicator.
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Makes the copy's buffers (the shards' sizes) and copies into them once: a first copy into
  // new memory takes several times a later one, and would stall the first save.
  void prepare(const RunConfig& cfg, const Shards& shards);
  // Waits for the save in flight, copies the shards' tensors (the time training stalls) and starts
  // writing them. cfg and partition must outlive the save.
  void start(const RunConfig& cfg, Shards shards, const std::vector<int>& partition,
             const TrainState& state);
  // Waits for the save in flight, if any: rank 0 prints where it went and how long it took;
  // rethrows its error (the write agrees on one verdict, so every rank throws alike).
  void wait();

private:
  const Layout& layout_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  Watchdog watchdog_;
  Snapshot snapshot_;
  std::thread thread_;
  std::exception_ptr error_;
  std::string path_;
  double started_ = 0.0, copy_s_ = 0.0, write_s_ = 0.0; // write_s_: set by the writer
};

} // namespace pt
