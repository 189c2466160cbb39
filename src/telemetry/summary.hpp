// End-of-run summaries that every rank takes part in: the op profile (log.op_profile) and the
// final parameters' digests (metrics.jsonl's final_params record).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/watchdog.hpp"
#include "model/gpt_stage.hpp"
#include "model/param_layout.hpp"
#include "telemetry/metrics.hpp"

namespace pt {

// Each op's calls and time, summed over the ranks of world, largest first, against the ranks'
// summed step time `steps_s`; printed on world's rank 0. Collective.
void print_op_profile(const Watchdog& watchdog, MPI_Comm world, int steps, bool after_first,
                      double steps_s);

// Per tensor of `whole`, in model order: an FNV-1a digest of the exact bytes (layouts that must
// be bit-identical compare these; 0 for tp shards), the sum of squares, and a random projection
// sum_i p_i u_i (u_i in [-1, 1] from a hash), which any single changed element moves. Each
// element is counted once (GptStage::counts_in_norm) and the parts are added over tp and pp, and
// the experts' over ep (MPI_COMM_NULL: none). Collective over those; the result on every rank.
std::vector<ParamSummary> summarize_params(const std::vector<GptStage*>& chunks,
                                           const ParamLayout& whole, const Watchdog& watchdog,
                                           MPI_Comm tp, MPI_Comm pp, MPI_Comm ep);

} // namespace pt
