// The memory model (docs/design.md section 6a, docs/memory.md): what each rank will allocate,
// predicted from the deck and the plan before anything is allocated, component by component, as the
// stages, the optimizer, the pipeline engine and the dp reduction allocate it; and the fit check
// against the memory each rank has.
#pragma once

#include <mpi.h>

#include <string>

#include "config/run_config.hpp"

namespace pt {

struct Backend;

class Layout;
struct Plan;

// Bytes one rank allocates, by component.
struct MemoryEstimate {
  double params = 0.0;    // parameters and their gradients (with the tied head's share)
  double optimizer = 0.0; // AdamW's m and v
  double activations = 0.0;
  double per_slot = 0.0;  // one micro-batch's activations (and stash) on every chunk of the rank
  int slots = 0;          // activation slots: the schedule's peak live micro-batches
  double messages = 0.0;  // pipeline receive and send buffers
  double workspace = 0.0; // backward scratch, recompute's working set
  double comm = 0.0;      // dp reduction scratch (ZeRO-1: the shard gradients, 2 buckets)
  double snapshot = 0.0;  // checkpoint.async: the host copy of the state a save writes
  double total() const {
    return params + optimizer + activations + messages + workspace + comm + snapshot;
  }
};

// The estimate for pipeline rank pp_rank (every tp and dp rank of it allocates the same), its dp
// group dp_node_size ranks per node (Layout::dp_node_size). be: the backend the run opens, whose
// attention buffers it counts (a GPU's keep less than the host's); null: the host's, for the
// planned threads a rank.
MemoryEstimate predict_memory(const RunConfig& cfg, const Plan& plan, int pp_rank, int dp_node_size,
                              const Backend* be = nullptr);

// The bytes this rank may use: 90% of its node's memory (or of the cgroup's limit, or of what
// the node has available now, when lower) shared by the ranks on the node, or with device.kind =
// "cuda" 90% of its GPU's memory shared by the ranks on it; `source` says which. Collective over
// `world`.
double memory_limit(const RunConfig& cfg, MPI_Comm world, std::string& source);

// Collective: throws pt::Error(bad_input) on every rank when any rank's estimate exceeds its
// limit, naming the estimate, the limit and what would make it fit.
void check_fit(const RunConfig& cfg, const Layout& layout, const Plan& plan);

} // namespace pt
