// Deck parsing and validation. Every error names where the value came from (file:line or the
// command-line override), the key, what was found, and what to change.
#include "config/run_config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "config/deck_keys.hpp"
#include "config/deck_reader.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

// Errors of validate(): the key's source and what to change.
struct Rules {
  const KeySource& where;
  [[noreturn]] void fail(const std::string& sec, const std::string& key,
                         const std::string& what) const {
    throw input_error((where ? where(sec, key) : sec + "." + key) + " " + what);
  }
};

// llama's keys: grouped-query heads that divide the heads, an even head size (RoPE turns pairs)
void check_llama(const ModelConfig& m, const Rules& r) {
  if (m.arch != Arch::llama) {
    for (const auto& [key, given] :
         {std::pair{"n_kv_head", m.n_kv_head != 0}, std::pair{"ffn_hidden", m.ffn_hidden != 0}}) {
      if (given) {
        r.fail("model", key, "is a llama key: set model.arch = \"llama\" or remove it");
      }
    }
    return;
  }
  if (m.n_kv_head > m.n_head || m.n_head % kv_heads(m) != 0) {
    r.fail("model", "n_kv_head",
           "= " + std::to_string(m.n_kv_head) +
               " does not divide model.n_head = " + std::to_string(m.n_head) +
               ": each key/value head serves the same number of query heads");
  }
  if (head_dim(m) % 2 != 0) {
    r.fail("model", "n_head",
           "= " + std::to_string(m.n_head) + " gives an odd head size, " +
               std::to_string(head_dim(m)) +
               ": rotary embeddings turn pairs of channels; pick d_model / n_head even");
  }
}

// The [moe] keys, and the layouts and formats MoE layers do not run yet (docs/moe.md)
void check_moe(const RunConfig& c, const Rules& r) {
  const ModelConfig& m = c.model;
  if (m.moe_experts == 0) return;
  if (m.moe_top_k > m.moe_experts) {
    r.fail("moe", "top_k",
           "= " + std::to_string(m.moe_top_k) + " is more than moe.experts = " +
               std::to_string(m.moe_experts) + ": a token goes to at most every expert once");
  }
  // what: the key's value; why: what the MoE layers lack; fix: the change that runs
  const auto refuse = [&](const char* sec, const char* key, const std::string& what,
                          const char* why, const char* fix) {
    r.fail(sec, key,
           what + " does not run with moe.experts > 0: " + why + " (docs/moe.md); " + fix);
  };
  if (c.parallel.tp > 1) {
    refuse("parallel", "tp", "= " + std::to_string(c.parallel.tp),
           "experts are not split over tensor-parallel ranks", "use parallel.tp = 1");
  }
  if (activation_format(c.device.precision) == ActFormat::bf16) {
    refuse("device", "precision", "= \"bf16\"", "the MoE layers keep fp32 activations only",
           "use device.precision = \"fp32\"");
  }
  if (c.device.kind != DeviceKind::host) {
    refuse("device", "kind", "= \"cuda\"", "routing and expert dispatch run on the host only",
           "use device.kind = \"host\"");
  }
}

void check_model_train_data(RunConfig& c, const Rules& r) {
  if (c.model.d_model % c.model.n_head != 0) {
    r.fail("model", "n_head",
           "= " + std::to_string(c.model.n_head) + " does not divide model.d_model = " +
               std::to_string(c.model.d_model) + ": choose a head count that divides d_model");
  }
  check_llama(c.model, r);
  check_moe(c, r);
  if (c.train.warmup_steps > c.train.steps) {
    c.warnings += "warning: train.warmup_steps = " + std::to_string(c.train.warmup_steps) +
                  " is more than train.steps = " + std::to_string(c.train.steps) +
                  ": every step warms up; the run is the first " + std::to_string(c.train.steps) +
                  " steps of the longer schedule\n";
  }
  if (c.data.path.empty()) r.fail("data", "path", "is empty: give the token file to train on");
  if (c.data.val_every > 0 && c.data.val_path.empty()) {
    r.fail("data", "val_every", "> 0 needs data.val_path (a token file of validation text)");
  }
  if (c.checkpoint.enabled && c.checkpoint.dir.empty()) {
    r.fail("checkpoint", "dir", "is empty: name a directory");
  }
  if (c.runtime.exit_after_steps > 0 && !c.checkpoint.enabled) {
    r.fail("runtime", "exit_after_steps",
           "> 0 stops the run to be continued, which needs checkpoints: add a [checkpoint] "
           "section (or checkpoint.dir=DIR)");
  }
}

void check_comm_device(const RunConfig& c, const Rules& r) {
  if (!c.comm.calibration.empty() && c.comm.topology != TopologyKind::automatic) {
    r.fail("comm", "calibration",
           "is given together with comm.topology = \"" + std::string(name(c.comm.topology)) +
               "\": the calibration file replaces the preset; remove one of the two");
  }
  if (c.comm.overlap == Overlap::poll && c.parallel.zero == 0 && c.comm.allreduce &&
      *c.comm.allreduce != AllreduceAlgo::mpi) {
    r.fail("comm", "overlap",
           "= \"poll\" reduces with MPI_Iallreduce, the library's non-blocking all-reduce, "
           "so it cannot run comm.allreduce = \"" +
               std::string(algorithm_name(*c.comm.allreduce)) +
               "\"; use comm.overlap = \"thread\" for that algorithm");
  }
  if (c.device.kind == DeviceKind::host && c.comm.gpu_collectives == GpuTransport::nccl) {
    r.fail("comm", "gpu_collectives",
           "= \"nccl\" needs device.kind = \"cuda\": NCCL reduces GPU memory, and the host "
           "backend's reductions are comm.allreduce's; remove the key or use device.kind=\"cuda\"");
  }
  if (c.device.kind == DeviceKind::host && c.comm.gpu_p2p == GpuTransport::nccl) {
    r.fail("comm", "gpu_p2p",
           "= \"nccl\" needs device.kind = \"cuda\": NCCL moves GPU memory between stages, and "
           "the host backend's stages talk MPI; remove the key or use device.kind=\"cuda\"");
  }
  const bool kernels =
      c.device.attention == AttentionKind::cudnn || c.device.attention == AttentionKind::flash;
  if (kernels && (c.device.kind != DeviceKind::cuda || c.device.precision != Precision::bf16)) {
    r.fail("device", "attention",
           "= \"" + std::string(name(c.device.attention)) +
               "\" needs device.kind = \"cuda\" and device.precision = \"bf16\": those kernels "
               "read bf16 on a GPU; remove the key or use \"auto\"");
  }
  const int head = c.model.n_head > 0 ? head_dim(c.model) : 0;
  if (c.device.attention == AttentionKind::flash && head != 32 && head != 64) {
    r.fail("device", "attention",
           "= \"flash\": the flash kernels take head sizes 32 and 64, and model.d_model / "
           "model.n_head is " +
               std::to_string(head) + "; use \"auto\" or \"cudnn\"");
  }
  if (c.device.kind == DeviceKind::host && c.device.precision == Precision::tf32) {
    r.fail("device", "precision",
           "= \"tf32\" needs device.kind = \"cuda\": tf32 is a tensor-core input format; on the "
           "host use \"fp32\" or \"bf16\" (bf16 activations, fp32 arithmetic)");
  }
}

// tp and sequence parallelism against the model's shapes.
void check_tensor_parallel(const RunConfig& c, const Rules& r) {
  const int tp = c.parallel.tp;
  const long long rows = static_cast<long long>(c.train.micro_batch) * c.model.seq_len;
  if (c.parallel.sequence_parallel && tp < 2) {
    r.fail("parallel", "sequence_parallel",
           "= true needs parallel.tp > 1: it splits the rows of the tensor-parallel group's "
           "replicated activations; set parallel.tp or remove the key");
  }
  if (c.parallel.sequence_parallel && rows % tp != 0) {
    r.fail("parallel", "sequence_parallel",
           "= true splits a micro-batch's micro_batch * seq_len = " + std::to_string(rows) +
               " token rows over parallel.tp = " + std::to_string(tp) +
               " ranks, which does not divide them: pick a seq_len or micro_batch that tp divides");
  }
  if (c.model.vocab_size % tp != 0) {
    r.fail("parallel", "tp",
           "= " + std::to_string(tp) +
               " does not divide model.vocab_size = " + std::to_string(c.model.vocab_size) +
               ": the embedding and head are split by vocabulary rows; pick a vocab_size that is "
               "a multiple of tp (pad the vocabulary)");
  }
  if (c.model.n_head % tp != 0) {
    r.fail("parallel", "tp",
           "= " + std::to_string(tp) + " does not divide model.n_head = " +
               std::to_string(c.model.n_head) + ": tensor parallelism splits whole heads");
  }
  if (kv_heads(c.model) % tp != 0) {
    r.fail("parallel", "tp",
           "= " + std::to_string(tp) +
               " does not divide model.n_kv_head = " + std::to_string(kv_heads(c.model)) +
               ": tensor parallelism splits whole key/value heads; pick n_kv_head a multiple of "
               "tp");
  }
  if (mlp_width(c.model) % tp != 0) {
    r.fail("parallel", "tp",
           "= " + std::to_string(tp) + " does not divide the MLP width " +
               std::to_string(mlp_width(c.model)) + " (model.ffn_hidden)");
  }
}

// parallel.ep: a divisor of dp and of the experts; what expert parallelism does not run with
void check_expert_parallel(const RunConfig& c, const Rules& r) {
  const int ep = c.parallel.ep, dp = c.parallel.dp, E = c.model.moe_experts;
  if (ep == 1) return;
  const std::string is = "= " + std::to_string(ep);
  if (E == 0) r.fail("parallel", "ep", is + " needs routed experts: set moe.experts > 0");
  if (dp % ep != 0) {
    r.fail("parallel", "ep",
           is + " does not divide parallel.dp = " + std::to_string(dp) +
               ": expert-parallel groups are blocks of ep data-parallel ranks");
  }
  if (E % ep != 0) {
    r.fail("parallel", "ep",
           is + " does not divide moe.experts = " + std::to_string(E) +
               ": every rank of an expert-parallel group holds the same number of experts");
  }
  if (c.parallel.zero == 1) {
    r.fail("parallel", "zero",
           "= 1 does not run with parallel.ep > 1 yet: ZeRO-1 shards the optimizer over dp, "
           "and the experts' gradients are reduced over the expert-data-parallel group "
           "(docs/moe.md); use parallel.zero = 0 or parallel.ep = 1");
  }
  if (c.data.val_every > 0 && c.data.val_batches % dp != 0) {
    r.fail("data", "val_batches",
           "= " + std::to_string(c.data.val_batches) +
               " is not a multiple of parallel.dp = " + std::to_string(dp) +
               ": with parallel.ep > 1 every rank of an expert-parallel group must run the "
               "same validation micro-batches; make it a multiple of dp");
  }
}

// pp * dp * tp against the job, the layers against the stages, the batch against dp.
void check_layout(RunConfig& c, int world_size, const Rules& r) {
  const int pp = c.parallel.pp;
  const int tp = c.parallel.tp;
  if (c.parallel.dp == 0) {
    if (world_size % (pp * tp) != 0) {
      r.fail("parallel", "pp",
             "* parallel.tp = " + std::to_string(pp * tp) + " does not divide the job's " +
                 std::to_string(world_size) + " ranks: launch a multiple of pp*tp ranks");
    }
    c.parallel.dp = world_size / (pp * tp);
  }
  const int dp = c.parallel.dp;
  if (static_cast<long long>(pp) * dp * tp != world_size) {
    r.fail("parallel", "dp",
           "= " + std::to_string(dp) + ": pp*dp*tp = " + std::to_string(pp) + "*" +
               std::to_string(dp) + "*" + std::to_string(tp) + " = " +
               std::to_string(static_cast<long long>(pp) * dp * tp) + " but the job has " +
               std::to_string(world_size) +
               " ranks: change the layout or the rank count (mpirun -np)");
  }
  if (c.model.n_layer < pp * c.parallel.virtual_stages) {
    r.fail("model", "n_layer",
           "= " + std::to_string(c.model.n_layer) + " is fewer than pp * virtual_stages = " +
               std::to_string(pp * c.parallel.virtual_stages) +
               ": every stage chunk needs at least one layer");
  }
  const long long per_step = static_cast<long long>(dp) * c.train.micro_batch; // may pass 2^31
  if (c.train.global_batch % per_step != 0) {
    r.fail("train", "global_batch",
           "= " + std::to_string(c.train.global_batch) +
               " is not divisible by dp * micro_batch = " + std::to_string(dp) + " * " +
               std::to_string(c.train.micro_batch) + ": make global_batch a multiple of " +
               std::to_string(per_step));
  }
  check_expert_parallel(c, r);
}

// What each schedule and ZeRO-1 run on, and the micro-batches and partition against the batch.
void check_schedule(RunConfig& c, const Rules& r) {
  if (c.parallel.schedule == ScheduleKind::two_bw &&
      (c.parallel.zero == 1 || c.device.kind == DeviceKind::cuda)) {
    r.fail("parallel", "schedule",
           "= \"2bw\" runs on the host backend without ZeRO-1 so far (its two weight versions "
           "are not written for the CUDA backend or a sharded optimizer); use device.kind = "
           "\"host\" and parallel.zero = 0, or another schedule");
  }
  const int accum = c.accumulation();
  if (c.parallel.micro_batches != 0 && c.parallel.micro_batches != accum) {
    r.fail("parallel", "micro_batches",
           "= " + std::to_string(c.parallel.micro_batches) +
               " disagrees with global_batch / (dp * micro_batch) = " + std::to_string(accum) +
               ": remove it or make the batch sizes agree");
  }
  c.parallel.micro_batches = accum;
  if (!c.parallel.partition_layers.empty()) {
    long long sum = 0; // entries are <= n_layer, but a list may be long
    for (int n : c.parallel.partition_layers) sum += n;
    const std::size_t want = static_cast<std::size_t>(c.parallel.pp * c.parallel.virtual_stages);
    if (c.parallel.partition_layers.size() != want || sum != c.model.n_layer) {
      r.fail("parallel", "partition",
             "lists " + std::to_string(c.parallel.partition_layers.size()) + " stages with " +
                 std::to_string(sum) +
                 " layers; it needs pp*virtual_stages = " + std::to_string(want) +
                 " entries summing to model.n_layer = " + std::to_string(c.model.n_layer));
    }
  }
}

} // namespace

int head_dim(const ModelConfig& m) {
  return m.d_model / m.n_head;
}

bool tied(const ModelConfig& m) {
  return m.tie_embeddings.value_or(m.arch == Arch::gpt2);
}

int kv_heads(const ModelConfig& m) {
  return m.arch == Arch::llama && m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
}

int mlp_width(const ModelConfig& m) {
  if (m.arch == Arch::gpt2) return 4 * m.d_model;
  if (m.ffn_hidden > 0) return m.ffn_hidden;
  return (8 * m.d_model / 3 + 255) / 256 * 256;
}

int qkv_rows(const ModelConfig& m) {
  return (m.n_head + 2 * kv_heads(m)) * head_dim(m);
}

bool is_moe_layer(const ModelConfig& m, int l) {
  return m.moe_experts > 0 && l % m.moe_every == 0;
}

int moe_layer_count(const ModelConfig& m) {
  return m.moe_experts > 0 ? (m.n_layer + m.moe_every - 1) / m.moe_every : 0;
}

int expert_width(const ModelConfig& m) {
  return m.moe_ffn_hidden > 0 ? m.moe_ffn_hidden : mlp_width(m);
}

void validate(RunConfig& c, int world_size, const KeySource& where) {
  const Rules r{where};
  if (c.train.min_lr && *c.train.min_lr > c.train.lr) {
    std::ostringstream os;
    os << "= " << *c.train.min_lr << " is out of range: expected a number in [0, " << c.train.lr
       << "] (train.lr)";
    r.fail("train", "min_lr", os.str());
  }
  if (!c.train.min_lr) c.train.min_lr = c.train.lr / 10.0;
  c.model.tie_embeddings = tied(c.model);
  if (c.log.trace_first == 0) c.log.trace_first = c.log.trace_last = std::min(2, c.train.steps);
  if (c.log.trace_last > c.train.steps) {
    r.fail("log", "trace_steps",
           "= [" + std::to_string(c.log.trace_first) + ", " + std::to_string(c.log.trace_last) +
               "] ends after train.steps = " + std::to_string(c.train.steps) +
               ": trace steps the run has (e.g. [2, 3])");
  }
  check_model_train_data(c, r);
  check_comm_device(c, r);
  check_tensor_parallel(c, r);
  check_layout(c, world_size, r);
  check_schedule(c, r);
}

RunConfig parse_deck(const std::string& text, const std::string& deck_path,
                     const std::vector<std::string>& overrides, int world_size) {
  toml::table root;
  try {
    root = toml::parse(text, deck_path);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw input_error(deck_path + ":" + std::to_string(src.begin.line) + ":" +
                      std::to_string(src.begin.column) +
                      ": not valid TOML: " + std::string(e.description()));
  }
  std::set<std::string> overridden;
  for (const auto& o : overrides) apply_override(root, o, overridden);

  const std::string renamed = rename_keys(root);
  DeckReader r(root, deck_path, overridden);
  r.reject_unknown(deck_sections());

  RunConfig c;
  c.deck_path = deck_path;
  c.warnings = renamed;
  // [checkpoint]: present (in the deck or as an override) means checkpointing is on
  c.checkpoint.enabled = r.has_section("checkpoint");
  for (const DeckKey& k : deck_keys()) {
    if (k.section == "checkpoint" && !c.checkpoint.enabled) continue;
    k.read(r, c);
  }
  validate(c, world_size,
           [&r](const std::string& sec, const std::string& key) { return r.where(sec, key); });

  // the resolved deck records what this run does: derived values written out
  if (toml::table* par = root.get_as<toml::table>("parallel")) {
    par->insert_or_assign("dp", static_cast<std::int64_t>(c.parallel.dp));
    par->insert_or_assign("micro_batches", static_cast<std::int64_t>(c.parallel.micro_batches));
  }
  if (toml::table* train = root.get_as<toml::table>("train")) {
    train->insert_or_assign("min_lr", *c.train.min_lr);
  }
  if (toml::table* model = root.get_as<toml::table>("model")) { // the architecture, whole
    model->insert_or_assign("arch", std::string(name(c.model.arch)));
    model->insert_or_assign("tie_embeddings", tied(c.model));
    if (c.model.arch == Arch::llama) {
      model->insert_or_assign("n_kv_head", static_cast<std::int64_t>(kv_heads(c.model)));
      model->insert_or_assign("ffn_hidden", static_cast<std::int64_t>(mlp_width(c.model)));
      model->insert_or_assign("rope_theta", c.model.rope_theta);
      model->insert_or_assign("norm_eps", c.model.norm_eps);
    }
  }
  std::ostringstream os;
  os << root;
  c.resolved_text = os.str();
  return c;
}

} // namespace pt
