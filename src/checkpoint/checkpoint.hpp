// HDF5 checkpoints (docs/design.md section 8, schema version 1): one file per checkpoint, written
// collectively with parallel HDF5; every tensor is one dataset with its global shape, so any
// layout (pp, dp, tp, partition) can read a checkpoint written by any other.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/layout.hpp"
#include "comm/watchdog.hpp"
#include "config/run_config.hpp"
#include "model/gpt_stage.hpp"
#include "optim/optimizer.hpp"
#include "util/memory_count.hpp"

namespace pt {

inline constexpr int kCheckpointSchema = 1;

struct TrainState {
  int step = 0; // optimizer steps completed
  long long tokens_seen = 0;
  double lr = 0.0; // the rate the last update used
};

// checkpoint.async: a copy in host memory of what a checkpoint writes of a rank's chunks, taken
// at the checkpoint step, which a writer then saves while training changes the live buffers.
// Per chunk: the parameters (its flat buffer), the optimizer's runs of each tensor with their
// moments copied into `moments`, and 2bw's older weights.
struct Snapshot {
  std::vector<CountedVector<float>> params, moments, older;
  std::vector<std::vector<std::vector<Optimizer::Run>>> runs; // [chunk][tensor], into moments
  int updates = 0;                                            // the optimizers' update count
};

// What a rank holds: its model chunks' stages and their optimizers' states (stages[c] <->
// opts[c]): AdamW's whole moments, or ZeRO-1's shard of them (written and read in place).
struct Shards {
  std::vector<GptStage*> stages;
  std::vector<Optimizer*> opts;
  // schedule = "2bw": per chunk, the weights one version older (/model_prev); null otherwise
  std::vector<FloatBuffer>* older = nullptr;
  // set: write_checkpoint writes this copy of the tensors (the stages and optimizers still give
  // the layout and which rank writes what)
  Snapshot* snapshot = nullptr;
  int sections() const { return older != nullptr ? 4 : 3; }
};

// Copies what this rank writes of the shards' tensors into s (host memory, kept for the next
// save: its buffers are reused when the sizes allow). A data-parallel replica copies its share.
void take_snapshot(const ModelConfig& model, const Layout& layout, const Shards& shards,
                   Snapshot& s);

// Collective over layout.world(), its waits under the watchdog. Writes <dir>/step_%08d.h5 through a
// .partial file, renames it, replaces <dir>/latest, then removes all but the newest checkpoint.keep
// checkpoints. Returns the published path. Throws pt::Error(other) naming the file if it cannot be
// written.
// comm: the communicator the write is collective over, layout.world() or a duplicate of it (an
// asynchronous writer's). background: the calling thread writes beside training (an
// asynchronous writer): after the collective creations it drops to the lowest CPU priority.
std::string write_checkpoint(const RunConfig& cfg, const Layout& layout, const Watchdog& watchdog,
                             Shards shards, const std::vector<int>& partition,
                             const TrainState& state, MPI_Comm comm, bool background = false);

// Collective. Loads this rank's slices of the checkpoint at `path` into the shards. Checks the
// format, schema version and every dataset's shape and type before reading; every dataset's
// checksum attribute is verified after reading. Throws pt::Error(checkpoint) naming the file and
// the problem.
TrainState read_checkpoint(const std::string& path, const RunConfig& cfg, const Layout& layout,
                           const Watchdog& watchdog, Shards shards);

// Collective. Applies checkpoint.resume: "none" -> no resume (returns false); a path -> that file,
// exit 3 if unusable; "auto" -> <dir>/latest, else the newest step_*.h5, falling back to older
// ones (and saying so on rank 0) when one is unusable; no checkpoint at all -> false.
bool resume(const RunConfig& cfg, const Layout& layout, const Watchdog& watchdog, Shards shards,
            TrainState& state, std::string& from);

} // namespace pt
