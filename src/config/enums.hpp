// The deck's string-valued keys as enums (docs/deck.md). config/run_config.cpp parses each deck
// string once; the rest of the code switches on these. name() / algorithm_name() give back the
// deck spelling, for messages, the printed plan and the resolved deck.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace pt {

enum class Arch { gpt2, llama };                            // model.arch (docs/models.md)
enum class DeviceKind { host, cuda };                       // device.kind
enum class Precision { fp32, tf32, bf16 };                  // device.precision
enum class AttentionKind { automatic, cudnn, flash, gemm }; // device.attention
// How a stage stores its activations and their gradients (docs/precision.md): fp32, or bf16
// (every stored value rounded to bfloat16), from device.precision on either backend
enum class ActFormat { fp32, bf16 };
constexpr ActFormat activation_format(Precision p) {
  return p == Precision::bf16 ? ActFormat::bf16 : ActFormat::fp32;
}
// parallel.schedule
// file: a schedule read from a CSV file (parallel.schedule = "file:PATH", docs/pipeline.md);
// search: one found for the run's stage costs under a memory budget
enum class ScheduleKind {
  gpipe,
  one_f_one_b,
  interleaved,
  zb_h1,
  zb_h2,
  zb_v,
  v_half,
  v_min,
  dualpipev,
  two_bw,
  file,
  search
};
enum class PartitionKind { uniform, params, time, explicit_layers }; // parallel.partition
enum class Overlap { none, thread, poll };                           // comm.overlap
enum class GpuTransport { automatic, nccl, mpi };                    // comm.gpu_collectives/p2p
enum class TopologyKind { automatic, flat, fat_tree, tianhe };       // comm.topology
enum class Recompute { none, selective, full };                      // train.recompute
enum class AlltoallKind { automatic, mpi, pairwise, hierarchical };  // comm.alltoall
enum class AllreduceAlgo { mpi, ring, recursive_doubling, rabenseifner, hierarchical, torus2d };

// comm.allreduce's algorithms in deck order (the deck's "auto" is no algorithm: nullopt).
inline constexpr AllreduceAlgo kAllreduceAlgos[] = {
    AllreduceAlgo::mpi,          AllreduceAlgo::ring,         AllreduceAlgo::recursive_doubling,
    AllreduceAlgo::rabenseifner, AllreduceAlgo::hierarchical, AllreduceAlgo::torus2d};

constexpr const char* name(DeviceKind k) {
  switch (k) {
  case DeviceKind::host:
    return "host";
  case DeviceKind::cuda:
    return "cuda";
  }
  return "?";
}

constexpr const char* name(Precision p) {
  switch (p) {
  case Precision::fp32:
    return "fp32";
  case Precision::tf32:
    return "tf32";
  case Precision::bf16:
    return "bf16";
  }
  return "?";
}

constexpr const char* name(AttentionKind a) {
  switch (a) {
  case AttentionKind::automatic:
    return "auto";
  case AttentionKind::cudnn:
    return "cudnn";
  case AttentionKind::flash:
    return "flash";
  case AttentionKind::gemm:
    return "gemm";
  }
  return "?";
}

constexpr const char* name(ScheduleKind s) {
  switch (s) {
  case ScheduleKind::gpipe:
    return "gpipe";
  case ScheduleKind::one_f_one_b:
    return "1f1b";
  case ScheduleKind::interleaved:
    return "interleaved";
  case ScheduleKind::zb_h1:
    return "zb-h1";
  case ScheduleKind::zb_h2:
    return "zb-h2";
  case ScheduleKind::zb_v:
    return "zb-v";
  case ScheduleKind::v_half:
    return "v-half";
  case ScheduleKind::v_min:
    return "v-min";
  case ScheduleKind::dualpipev:
    return "dualpipev";
  case ScheduleKind::two_bw:
    return "2bw";
  case ScheduleKind::file:
    return "file";
  case ScheduleKind::search:
    return "search";
  }
  return "?";
}

constexpr const char* name(PartitionKind p) {
  switch (p) {
  case PartitionKind::uniform:
    return "uniform";
  case PartitionKind::params:
    return "params";
  case PartitionKind::time:
    return "time";
  case PartitionKind::explicit_layers: // the deck gives a list; plans and checkpoints say this
    return "explicit";
  }
  return "?";
}

constexpr const char* name(Arch a) {
  return a == Arch::llama ? "llama" : "gpt2";
}

constexpr const char* name(Recompute r) {
  switch (r) {
  case Recompute::none:
    return "none";
  case Recompute::selective:
    return "selective";
  case Recompute::full:
    return "full";
  }
  return "?";
}

constexpr const char* name(Overlap o) {
  switch (o) {
  case Overlap::none:
    return "none";
  case Overlap::thread:
    return "thread";
  case Overlap::poll:
    return "poll";
  }
  return "?";
}

constexpr const char* name(AlltoallKind a) {
  switch (a) {
  case AlltoallKind::automatic:
    return "auto";
  case AlltoallKind::mpi:
    return "mpi";
  case AlltoallKind::pairwise:
    return "pairwise";
  case AlltoallKind::hierarchical:
    return "hierarchical";
  }
  return "?";
}

constexpr const char* name(GpuTransport t) {
  switch (t) {
  case GpuTransport::automatic:
    return "auto";
  case GpuTransport::nccl:
    return "nccl";
  case GpuTransport::mpi:
    return "mpi";
  }
  return "?";
}

constexpr const char* name(TopologyKind t) {
  switch (t) {
  case TopologyKind::automatic:
    return "auto";
  case TopologyKind::flat:
    return "flat";
  case TopologyKind::fat_tree:
    return "fat-tree";
  case TopologyKind::tianhe:
    return "tianhe";
  }
  return "?";
}

constexpr const char* algorithm_name(AllreduceAlgo algo) {
  switch (algo) {
  case AllreduceAlgo::mpi:
    return "mpi";
  case AllreduceAlgo::ring:
    return "ring";
  case AllreduceAlgo::recursive_doubling:
    return "recursive-doubling";
  case AllreduceAlgo::rabenseifner:
    return "rabenseifner";
  case AllreduceAlgo::hierarchical:
    return "hierarchical";
  case AllreduceAlgo::torus2d:
    return "torus2d";
  }
  return "?";
}

// Deck name -> algorithm: "mpi", "ring", "recursive-doubling", "rabenseifner", "hierarchical",
// "torus2d"; "auto" -> nullopt. Throws std::invalid_argument for other names.
inline std::optional<AllreduceAlgo> parse_allreduce(const std::string& name) {
  if (name == "auto") return std::nullopt;
  for (AllreduceAlgo a : kAllreduceAlgos) {
    if (name == algorithm_name(a)) return a;
  }
  throw std::invalid_argument("unknown all-reduce algorithm \"" + name + "\"");
}

} // namespace pt
