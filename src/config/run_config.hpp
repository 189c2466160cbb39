// The input deck (docs/design.md section 4) as a typed, validated RunConfig. The member
// initializers are the deck's defaults; config/deck_keys.hpp is the table of keys that reads them
// and documents them (docs/deck.md).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/enums.hpp"

namespace pt {

struct ModelConfig {
  Arch arch = Arch::gpt2;
  int n_layer = 0;
  int n_head = 0;
  int d_model = 0;
  int seq_len = 0;
  int vocab_size = 0;
  // llama: key/value heads (grouped-query attention; 0: n_head), the SwiGLU width (0: 8 d_model
  // / 3 rounded up to a multiple of 256), the rotary base and RMSNorm's epsilon
  int n_kv_head = 0;
  int ffn_hidden = 0;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  // the head reuses the token embedding; absent: the architecture's default (tied())
  std::optional<bool> tie_embeddings;
  // [moe] (docs/moe.md): routed experts in place of the MLP of every moe_every-th block (layers
  // 0, every, 2 every, ...); 0 experts: a dense model. Each token goes to its top_k experts
  // (softmax, top-k, weights renormalised over the chosen) and to every shared expert; the expert
  // width 0 means the dense MLP's. capacity_factor 0: dropless; > 0: each expert takes at most
  // ceil(factor * tokens * top_k / experts) tokens of a micro-batch, the rest are dropped. The
  // load-balancing loss (Switch form) and the router z-loss are weighted by aux_loss, z_loss.
  int moe_experts = 0;
  int moe_top_k = 2;
  int moe_ffn_hidden = 0;
  int moe_every = 1;
  int moe_shared_experts = 0;
  double moe_capacity_factor = 0.0;
  double moe_aux_loss = 0.01;
  double moe_z_loss = 0.0;
  bool operator==(const ModelConfig&) const = default;
};

// Derived shapes: the head size; key/value heads (n_head for gpt2); the MLP's hidden width (4
// d_model for gpt2, llama's SwiGLU width); the rows of the packed qkv projection; whether the
// head is the token embedding (the deck's value, else true for gpt2 and false for llama).
int head_dim(const ModelConfig& m);
bool tied(const ModelConfig& m);
int kv_heads(const ModelConfig& m);
int mlp_width(const ModelConfig& m);
int qkv_rows(const ModelConfig& m);
// Mixture of experts: whether layer l's MLP is routed experts; the MoE layers in order; an
// expert's hidden width (moe_ffn_hidden, else mlp_width).
bool is_moe_layer(const ModelConfig& m, int l);
int moe_layer_count(const ModelConfig& m);
int expert_width(const ModelConfig& m);

struct ParallelConfig {
  int pp = 1;
  int dp = 0; // 0 in the deck: ranks / (pp*tp)
  int tp = 1;
  // expert parallelism (docs/moe.md): each block of ep consecutive dp ranks shares the routed
  // experts, experts / ep each, and exchanges tokens by all-to-all; divides dp
  int ep = 1;
  int virtual_stages = 1;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  // schedule file: the path after "file:" and the file's text (load_deck reads it on rank 0)
  std::string schedule_file, schedule_csv;
  // schedule search: the activations a rank may hold, in multiples of pp micro-batches
  double search_memory = 1.0;
  int micro_batches = 0; // per pipeline per step; derived from the batch sizes
  PartitionKind partition = PartitionKind::uniform;
  std::vector<int> partition_layers;  // explicit_layers: the deck's list
  bool allow_tp_across_nodes = false; // a tp group spanning nodes is an error unless set
  int zero = 0; // 1: ZeRO-1, AdamW's state and update sharded over dp (docs/memory.md)
  // tp > 1: the residual stream and its norms on N/tp rows per rank (docs/tensor-parallel.md)
  bool sequence_parallel = false;
  bool operator==(const ParallelConfig&) const = default;
};

struct TrainConfig {
  int steps = 0;
  int global_batch = 0; // sequences per optimizer step, all data-parallel ranks together
  int micro_batch = 0;  // sequences per forward/backward
  double lr = 3e-4;
  std::optional<double> min_lr; // absent: lr / 10 (validate() resolves it)
  int warmup_steps = 0;
  double weight_decay = 0.1;
  double grad_clip = 1.0; // 0: off
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  std::uint64_t seed = 1337;
  // activations recomputed in the backward instead of kept (docs/design.md section 6a): selective,
  // the attention probabilities; full, everything of a block but its input
  Recompute recompute = Recompute::none;
  // optimizer post-validation (docs/pipeline.md): each rank updates before the global gradient
  // norm arrives and redoes the update where clipping applies
  bool post_validation = false;
  bool operator==(const TrainConfig&) const = default;
};

struct DataConfig {
  std::string path;
  std::string val_path;
  int val_every = 0;   // 0: no validation during training
  int val_batches = 4; // micro-batches per validation pass
  bool operator==(const DataConfig&) const = default;
};

struct CheckpointConfig {
  bool enabled = false; // a [checkpoint] section (or a checkpoint.* override) is present
  std::string dir = "checkpoints";
  int every = 0; // steps between checkpoints; 0: only at the end (and on stops)
  int keep = 3;  // newest checkpoints kept
  // a host copy of the state at the checkpoint step, written by a thread while training goes on
  bool async = false;
  std::string resume = "auto"; // auto | none | <file>
  std::string init_from;       // a Hugging Face directory: the starting weights when not resuming
  bool operator==(const CheckpointConfig&) const = default;
};

struct CommConfig {
  std::optional<AllreduceAlgo> allreduce; // nullopt: "auto"
  bool autotune = true; // auto: measure the algorithms on the first calls of each size
  TopologyKind topology = TopologyKind::automatic;
  std::string calibration; // a `pipetrain-bench calibrate` file (topology auto)
  double bucket_mb = 25.0;
  Overlap overlap = Overlap::none;                 // gradient reduction during backward
  AlltoallKind alltoall = AlltoallKind::automatic; // parallel.ep > 1: the expert token exchange
  int ranks_per_node = 0;                          // 0: detect from shared memory
  // device.kind = "cuda": the dp/tp reductions through NCCL on device memory, or through MPI on
  // host copies; auto: NCCL where the build has it and no two ranks share a GPU
  GpuTransport gpu_collectives = GpuTransport::automatic;
  // device.kind = "cuda": the pipeline's activations and gradients between stages through NCCL
  // send/receive on device memory, or through MPI on host copies (the default: the NCCL path
  // has not yet run on two GPUs; docs/cuda.md)
  GpuTransport gpu_p2p = GpuTransport::mpi; // mpi | nccl (no auto)
  bool operator==(const CommConfig&) const = default;
};

struct DeviceConfig {
  DeviceKind kind = DeviceKind::host;
  // matrix products: fp32 | tf32 | bf16 (bf16/tf32 tensor-core inputs with fp32 accumulation,
  // fp32 weights, activations and optimizer state; CUDA only)
  Precision precision = Precision::fp32;
  // attention kernels on a GPU at bf16: auto (the measured fastest that takes the shape), cudnn,
  // flash, gemm
  AttentionKind attention = AttentionKind::automatic;
  int threads = 0; // host threads per rank; 0: OMP_NUM_THREADS, else affinity / sharing ranks
  bool operator==(const DeviceConfig&) const = default;
};

struct LogConfig {
  int every = 1;
  std::string dir = "runs";
  bool trace = false;
  // log.trace_steps = [first, last], 1-based, inclusive; 0: the second step, or the first of a
  // one-step run (validate() resolves it)
  int trace_first = 0, trace_last = 0;
  bool op_profile = false;    // time every kernel op (synchronized), print a table at the end
  bool param_digests = false; // every logged step's parameter summaries into metrics.jsonl
  bool operator==(const LogConfig&) const = default;
};

struct RuntimeConfig {
  double hang_timeout_s = 600.0;
  bool deterministic = false;
  int exit_after_steps = 0;
  bool operator==(const RuntimeConfig&) const = default;
};

struct RunConfig {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  DataConfig data;
  CheckpointConfig checkpoint;
  CommConfig comm;
  DeviceConfig device;
  LogConfig log;
  RuntimeConfig runtime;

  std::string deck_path;     // where the deck came from (for messages)
  std::string resolved_text; // the deck with overrides and defaults applied, as TOML
  std::string warnings;      // "warning: ...\n" lines for the printed plan (rank 0)

  // Micro-batches each data-parallel rank runs per step.
  int accumulation() const { return train.global_batch / (parallel.dp * train.micro_batch); }
};

// Parses deck text plus `section.key=value` overrides (applied in order; the last wins) and
// validates it for a job of `world_size` ranks. Throws pt::Error(bad_input) with one message
// naming the file or override, the key, what was found and what to change.
RunConfig parse_deck(const std::string& text, const std::string& deck_path,
                     const std::vector<std::string>& overrides, int world_size);

// Where a key's value came from, for messages: "deck.toml:12: train.lr", "command-line override
// train.lr"; for a RunConfig made in code, "section.key".
using KeySource = std::function<std::string(const std::string& section, const std::string& key)>;

// The rules between keys, for a job of world_size ranks, and the derived values: dp and
// micro_batches from the batch sizes, min_lr, trace_steps. Throws pt::Error(bad_input) naming
// the key (through `where`); appends to c.warnings. parse_deck calls it; a RunConfig made in code
// calls it too, so that it equals the one parsed from a deck with the same keys.
void validate(RunConfig& c, int world_size, const KeySource& where = {});

} // namespace pt
