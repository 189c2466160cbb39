#include "config/deck_keys.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace pt {
namespace {

constexpr std::int64_t kBig = 1 << 30;

// What a builder needs beyond the field: the doc line, and where the generated text will not do,
// the range or default as docs/deck.md shows them.
struct Doc {
  const char* doc;
  const char* status = "yes";
  const char* range = nullptr; // default: from the bounds or choices
  const char* def = nullptr;   // default: from RunConfig's initializer
};

std::string text_of(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A number as its shortest text that reads back to the same double.
std::string exact_text(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string int_range(std::int64_t lo, std::int64_t hi) {
  if (hi >= kBig) return ">= " + std::to_string(lo);
  return std::to_string(lo) + ".." + std::to_string(hi);
}

DeckKey make(const char* sec, const char* name, const char* type, const Doc& d, std::string def,
             std::string range) {
  DeckKey k;
  k.section = sec;
  k.name = name;
  k.type = type;
  k.def = d.def != nullptr ? d.def : std::move(def);
  k.range = d.range != nullptr ? d.range : std::move(range);
  k.doc = d.doc;
  k.status = d.status;
  return k;
}

// An integer key of field s.f in [lo, hi]; required: no default, the deck must give it.
template <class S, class T>
DeckKey integer(const char* sec, const char* name, S RunConfig::*s, T S::*f, std::int64_t lo,
                std::int64_t hi, const Doc& d, bool required = false) {
  const T def = RunConfig{}.*s.*f;
  DeckKey k =
      make(sec, name, "int", d, required ? "required" : std::to_string(def), int_range(lo, hi));
  std::optional<std::int64_t> dv;
  if (!required) dv = static_cast<std::int64_t>(def);
  k.read = [=](DeckReader& r, RunConfig& c) {
    c.*s.*f = static_cast<T>(r.get_int(sec, name, dv, lo, hi));
  };
  k.value = [=](const RunConfig& c) { return std::to_string(c.*s.*f); };
  return k;
}

// A number in [lo, hi], or (lo, hi] when lo_open.
template <class S>
DeckKey number(const char* sec, const char* name, S RunConfig::*s, double S::*f, double lo,
               double hi, bool lo_open, const Doc& d) {
  const double def = RunConfig{}.*s.*f;
  DeckKey k = make(sec, name, "float", d, text_of(def),
                   (lo_open ? "(" : "[") + text_of(lo) + ", " + text_of(hi) + "]");
  k.read = [=](DeckReader& r, RunConfig& c) {
    c.*s.*f = r.get_double(sec, name, def, lo, hi, lo_open);
  };
  k.value = [=](const RunConfig& c) { return exact_text(c.*s.*f); };
  return k;
}

template <class S>
DeckKey boolean(const char* sec, const char* name, S RunConfig::*s, bool S::*f, const Doc& d) {
  const bool def = RunConfig{}.*s.*f;
  DeckKey k = make(sec, name, "bool", d, def ? "true" : "false", "");
  k.read = [=](DeckReader& r, RunConfig& c) { c.*s.*f = r.get_bool(sec, name, def); };
  k.value = [=](const RunConfig& c) { return std::string(c.*s.*f ? "true" : "false"); };
  return k;
}

// A string; required: no default.
template <class S>
DeckKey text(const char* sec, const char* name, S RunConfig::*s, std::string S::*f, const Doc& d,
             bool required = false) {
  const std::string def = RunConfig{}.*s.*f;
  DeckKey k = make(sec, name, "string", d, required ? "required" : "\"" + def + "\"", "");
  std::optional<std::string> dv;
  if (!required) dv = def;
  k.read = [=](DeckReader& r, RunConfig& c) { c.*s.*f = r.get_string(sec, name, dv); };
  k.value = [=](const RunConfig& c) { return c.*s.*f; };
  return k;
}

// A string naming one of `values` (spelled as name() gives them), stored as its enum.
template <class S, class E>
DeckKey choice(const char* sec, const char* name, S RunConfig::*s, E S::*f,
               std::initializer_list<E> values, const Doc& d) {
  const E def = RunConfig{}.*s.*f;
  std::string range;
  for (E v : values) range += (range.empty() ? "" : ", ") + std::string(pt::name(v));
  DeckKey k = make(sec, name, "string", d, "\"" + std::string(pt::name(def)) + "\"", range);
  const std::vector<E> list(values);
  k.read = [=](DeckReader& r, RunConfig& c) {
    std::vector<std::string> allowed;
    for (E v : list) allowed.push_back(pt::name(v));
    const std::string got = r.get_string(sec, name, std::string(pt::name(def)), allowed);
    for (E v : list) {
      if (got == pt::name(v)) c.*s.*f = v;
    }
  };
  k.value = [=](const RunConfig& c) { return std::string(pt::name(c.*s.*f)); };
  return k;
}

// model.tie_embeddings: left out, the architecture's default (tied(): true for gpt2, false for
// llama), resolved by validate().
DeckKey tie_embeddings_key() {
  DeckKey k = make("model", "tie_embeddings", "bool",
                   {"the head reuses the token embedding; false adds `lm_head/weight`"},
                   "true (gpt2), false (llama)", "");
  k.read = [](DeckReader& r, RunConfig& c) {
    if (r.raw("model", "tie_embeddings") == nullptr) return;
    c.model.tie_embeddings = r.get_bool("model", "tie_embeddings", false); // present: no default
  };
  k.value = [](const RunConfig& c) { return std::string(tied(c.model) ? "true" : "false"); };
  return k;
}

// parallel.partition: a strategy's name, or a list of layer counts per virtual stage.
DeckKey partition_key() {
  DeckKey k = make("parallel", "partition", "string or list",
                   {"layers per stage: uniform, params, time (profiled at startup), or a list of "
                    "layer counts per virtual stage"},
                   "\"uniform\"", "uniform, params, time, [n, ...]");
  k.read = [](DeckReader& r, RunConfig& c) {
    const toml::node* p = r.raw("parallel", "partition");
    if (p == nullptr || !p->is_array()) {
      c.parallel.partition =
          r.get_enum("parallel", "partition", RunConfig{}.parallel.partition,
                     {PartitionKind::uniform, PartitionKind::params, PartitionKind::time});
      return;
    }
    c.parallel.partition = PartitionKind::explicit_layers;
    for (const auto& e : *p->as_array()) { // their sum against model.n_layer: validate()
      if (!e.is_integer() || *e.value<std::int64_t>() < 1 ||
          *e.value<std::int64_t>() > std::numeric_limits<int>::max()) {
        r.fail("parallel", "partition",
               "= " + describe(*p) +
                   ": an explicit partition is a list of layer counts per stage, each >= 1");
      }
      c.parallel.partition_layers.push_back(static_cast<int>(*e.value<std::int64_t>()));
    }
  };
  k.value = [](const RunConfig& c) {
    if (c.parallel.partition != PartitionKind::explicit_layers) {
      return std::string(name(c.parallel.partition));
    }
    std::string list;
    for (int n : c.parallel.partition_layers)
      list += (list.empty() ? "" : ", ") + std::to_string(n);
    return "[" + list + "]";
  };
  return k;
}

// train.min_lr: at most train.lr (read after it); absent: lr / 10, resolved by validate().
DeckKey min_lr_key() {
  DeckKey k = make("train", "min_lr", "float", {"end of the cosine decay"}, "lr / 10", "[0, lr]");
  k.read = [](DeckReader& r, RunConfig& c) {
    if (r.raw("train", "min_lr") == nullptr) return;
    c.train.min_lr = r.get_double("train", "min_lr", std::nullopt, 0.0, c.train.lr);
  };
  k.value = [](const RunConfig& c) {
    return c.train.min_lr ? exact_text(*c.train.min_lr) : std::string("lr / 10");
  };
  return k;
}

// parallel.schedule: a built-in schedule by name, or "file:PATH", a CSV schedule.
DeckKey schedule_key() {
  DeckKey k = make("parallel", "schedule", "string",
                   {"the pipeline schedule (docs/pipeline.md): interleaved needs pp >= 2, "
                    "virtual_stages >= 2 and micro-batches divisible by pp; zb-v, v-half, v-min "
                    "and dualpipev need virtual_stages = 2 (dualpipev: micro-batches >= 2 pp); "
                    "zb-h2 is zero bubble at twice 1F1B's activations; 2bw is "
                    "asynchronous PipeDream-2BW (micro-batches >= pp, host backend, no ZeRO-1); "
                    "file:PATH runs the CSV schedule at PATH (PyTorch's compute-only form; "
                    "`pipetrain schedule` writes one); search finds one for the stage costs "
                    "within parallel.search_memory (virtual_stages 1) and writes it to log.dir"},
                   "\"1f1b\"",
                   "gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, v-half, v-min, dualpipev, 2bw, "
                   "search, file:PATH");
  k.read = [](DeckReader& r, RunConfig& c) {
    const toml::node* n = r.raw("parallel", "schedule");
    const std::string prefix = "file:";
    if (n != nullptr && n->is_string() && n->as_string()->get().rfind(prefix, 0) == 0) {
      c.parallel.schedule = ScheduleKind::file;
      c.parallel.schedule_file = n->as_string()->get().substr(prefix.size());
      if (c.parallel.schedule_file.empty()) {
        r.fail("parallel", "schedule", "= \"file:\" names no file: write file:PATH");
      }
      return;
    }
    c.parallel.schedule = r.get_enum(
        "parallel", "schedule", RunConfig{}.parallel.schedule,
        {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
         ScheduleKind::zb_h1, ScheduleKind::zb_h2, ScheduleKind::zb_v, ScheduleKind::v_half,
         ScheduleKind::v_min, ScheduleKind::dualpipev, ScheduleKind::two_bw, ScheduleKind::search});
  };
  k.value = [](const RunConfig& c) {
    if (c.parallel.schedule == ScheduleKind::file) return "file:" + c.parallel.schedule_file;
    return std::string(name(c.parallel.schedule));
  };
  return k;
}

// comm.allreduce: "auto" (no fixed algorithm) or one of kAllreduceAlgos.
DeckKey allreduce_key() {
  std::vector<std::string> algos = {"auto"};
  for (AllreduceAlgo a : kAllreduceAlgos) algos.push_back(algorithm_name(a));
  std::string range;
  for (const auto& a : algos) range += (range.empty() ? "" : ", ") + a;
  DeckKey k = make("comm", "allreduce", "string",
                   {"the dp gradient all-reduce (docs/collectives.md); auto: the least modelled "
                    "time per bucket size, refined by one measurement (autotune)"},
                   "\"auto\"", range);
  k.read = [algos](DeckReader& r, RunConfig& c) {
    c.comm.allreduce = parse_allreduce(r.get_string("comm", "allreduce", algos.front(), algos));
  };
  k.value = [](const RunConfig& c) {
    return c.comm.allreduce ? algorithm_name(*c.comm.allreduce) : std::string("auto");
  };
  return k;
}

// log.trace_steps = [first, last]; absent: resolved by validate() (the second step).
DeckKey trace_steps_key() {
  DeckKey k = make("log", "trace_steps", "[int, int]", {"the steps traced, 1-based, inclusive"},
                   "[2, 2] (the first step when the run has one)", "1 <= first <= last <= steps");
  k.read = [](DeckReader& r, RunConfig& c) {
    const toml::node* t = r.raw("log", "trace_steps");
    if (t == nullptr) return;
    const toml::array* a = t->as_array();
    const bool two = a != nullptr && a->size() == 2 && (*a)[0].is_integer() && (*a)[1].is_integer();
    const long long first = two ? *(*a)[0].value<std::int64_t>() : 0;
    const long long last = two ? *(*a)[1].value<std::int64_t>() : 0;
    if (!two || first < 1 || first > last || last > kBig) { // last <= train.steps: validate()
      r.fail("log", "trace_steps",
             "must be [first, last], two step numbers with 1 <= first <= last <= train.steps "
             "(e.g. [2, 3])");
    }
    c.log.trace_first = static_cast<int>(first);
    c.log.trace_last = static_cast<int>(last);
  };
  k.value = [](const RunConfig& c) {
    return "[" + std::to_string(c.log.trace_first) + ", " + std::to_string(c.log.trace_last) + "]";
  };
  return k;
}

std::vector<DeckKey> make_table() {
  using RC = RunConfig;
  using M = ModelConfig;
  using P = ParallelConfig;
  using T = TrainConfig;
  using D = DataConfig;
  using K = CheckpointConfig;
  using C = CommConfig;
  using V = DeviceConfig;
  using L = LogConfig;
  using R = RuntimeConfig;
  const std::int64_t max_i64 = std::numeric_limits<std::int64_t>::max();
  return {
      choice("model", "arch", &RC::model, &M::arch, {Arch::gpt2, Arch::llama},
             {"the architecture (docs/models.md): gpt2 (LayerNorm, learned positions, GELU MLP, "
              "biases) or llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query "
              "attention, no biases)"}),
      integer("model", "n_layer", &RC::model, &M::n_layer, 1, 4096, {"transformer blocks"}, true),
      integer("model", "n_head", &RC::model, &M::n_head, 1, 4096,
              {"attention heads", "yes", "1..4096, divides d_model"}, true),
      integer("model", "d_model", &RC::model, &M::d_model, 1, 1 << 16, {"model width"}, true),
      integer("model", "seq_len", &RC::model, &M::seq_len, 1, 1 << 20, {"tokens per sequence"},
              true),
      integer("model", "vocab_size", &RC::model, &M::vocab_size, 2, 1 << 24,
              {"vocabulary size; above 65536 the token files are version 2 (uint32 tokens, "
               "docs/design.md section 7)",
               "yes", "2..16777216"},
              true),
      tie_embeddings_key(),
      integer("model", "n_kv_head", &RC::model, &M::n_kv_head, 0, 4096,
              {"llama: key/value heads (grouped-query attention), dividing n_head; 0 = n_head"}),
      integer("model", "ffn_hidden", &RC::model, &M::ffn_hidden, 0, 1 << 20,
              {"llama: the SwiGLU MLP's width; 0 = 8 d_model / 3 rounded up to a multiple of "
               "256"}),
      number("model", "rope_theta", &RC::model, &M::rope_theta, 0.0, 1e9, true,
             {"llama: the rotary embedding's base"}),
      number("model", "norm_eps", &RC::model, &M::norm_eps, 0.0, 1.0, true,
             {"llama: RMSNorm's epsilon (gpt2's LayerNorm uses 1e-5)"}),

      integer("moe", "experts", &RC::model, &M::moe_experts, 0, 4096,
              {"routed experts of an MoE layer (docs/moe.md); 0 = a dense model"}),
      integer("moe", "top_k", &RC::model, &M::moe_top_k, 1, 4096,
              {"experts each token goes to: the k largest router probabilities, their weights "
               "renormalised to sum to 1 (Mixtral's router)",
               "yes", "1..moe.experts"}),
      integer("moe", "ffn_hidden", &RC::model, &M::moe_ffn_hidden, 0, 1 << 20,
              {"an expert's hidden width; 0 = the dense MLP's (gpt2: 4 d_model; llama: "
               "model.ffn_hidden)"}),
      integer("moe", "every", &RC::model, &M::moe_every, 1, 4096,
              {"an MoE layer every k blocks: layers 0, k, 2k, ...; the others keep the dense MLP"}),
      integer("moe", "shared_experts", &RC::model, &M::moe_shared_experts, 0, 64,
              {"always-on experts of the expert width that every token also goes to, with "
               "weight 1"}),
      number("moe", "capacity_factor", &RC::model, &M::moe_capacity_factor, 0.0, 1024.0, false,
             {"0 = dropless; > 0: an expert takes at most ceil(factor * tokens * top_k / "
              "experts) tokens of a micro-batch, later ones (in token order) are dropped and "
              "counted"}),
      number("moe", "aux_loss", &RC::model, &M::moe_aux_loss, 0.0, 1e3, false,
             {"weight of the load-balancing loss (Switch/Mixtral form, per MoE layer, added to "
              "the training objective; metrics.jsonl's loss stays the cross-entropy)"}),
      number("moe", "z_loss", &RC::model, &M::moe_z_loss, 0.0, 1e3, false,
             {"weight of the router z-loss (ST-MoE: mean squared log-sum-exp of the router "
              "logits); 0 = off"}),

      integer("parallel", "pp", &RC::parallel, &P::pp, 1, 65536, {"pipeline ranks"}),
      integer("parallel", "tp", &RC::parallel, &P::tp, 1, 65536,
              {"tensor-parallel degree; must divide n_head and vocab_size "
               "(docs/tensor-parallel.md)"}),
      integer(
          "parallel", "dp", &RC::parallel, &P::dp, 0, 1 << 24,
          {"data-parallel replicas; left out (or 0): ranks / (pp*tp)", "yes", nullptr, "derived"}),
      integer("parallel", "ep", &RC::parallel, &P::ep, 1, 65536,
              {"expert-parallel degree (docs/moe.md): each group of ep consecutive dp ranks "
               "holds moe.experts / ep routed experts a rank and sends tokens to their experts "
               "by all-to-all; must divide dp and moe.experts"}),
      integer("parallel", "virtual_stages", &RC::parallel, &P::virtual_stages, 1, 64,
              {"model chunks per pipeline rank (interleaved placement: stage s on rank s % pp; V "
               "placement for zb-v and dualpipev)"}),
      schedule_key(),
      number("parallel", "search_memory", &RC::parallel, &P::search_memory, 0.1, 64.0, false,
             {"schedule = \"search\": the activations a rank may hold, in multiples of 1F1B's "
              "largest (pp micro-batches): 1 = 1F1B's memory, 2 = ZB-H2's"}),
      integer("parallel", "micro_batches", &RC::parallel, &P::micro_batches, 0, kBig,
              {"micro-batches per step per pipeline; if given must equal global_batch / (dp * "
               "micro_batch)",
               "yes", nullptr, "derived"}),
      partition_key(),
      boolean("parallel", "allow_tp_across_nodes", &RC::parallel, &P::allow_tp_across_nodes,
              {"a tp group spanning nodes is an error unless true (then a warning)"}),
      integer("parallel", "zero", &RC::parallel, &P::zero, 0, 1,
              {"1: ZeRO-1, AdamW's state and update sharded over the dp group (docs/memory.md); "
               "the gradient buckets reduce-scattered, overlapped with the backward as "
               "comm.overlap says",
               "yes (CUDA: not yet run on a GPU)"}),
      boolean("parallel", "sequence_parallel", &RC::parallel, &P::sequence_parallel,
              {"with tp > 1: the residual stream, its norms and the pipeline messages on N/tp "
               "token rows per rank (docs/tensor-parallel.md); tp must divide micro_batch * "
               "seq_len"}),

      integer("train", "steps", &RC::train, &T::steps, 1, kBig,
              {"optimizer steps; the LR schedule spans them"}, true),
      integer("train", "global_batch", &RC::train, &T::global_batch, 1, kBig,
              {"sequences per step, all data-parallel ranks together"}, true),
      integer("train", "micro_batch", &RC::train, &T::micro_batch, 1, kBig,
              {"sequences per forward/backward on one rank"}, true),
      number("train", "lr", &RC::train, &T::lr, 0.0, 10.0, true, {"peak learning rate"}),
      min_lr_key(),
      integer("train", "warmup_steps", &RC::train, &T::warmup_steps, 0, kBig,
              {"linear warmup: step s uses lr*(s+1)/warmup_steps; more than `steps` warns, and "
               "the run is the first `steps` steps of that longer schedule"}),
      number("train", "weight_decay", &RC::train, &T::weight_decay, 0.0, 10.0, false,
             {"AdamW decoupled decay, on matrices and embeddings only"}),
      number("train", "grad_clip", &RC::train, &T::grad_clip, 0.0, 1e6, false,
             {"global grad-norm clipping (torch.nn.utils.clip_grad_norm_ semantics); 0 = off"}),
      boolean("train", "post_validation", &RC::train, &T::post_validation,
              {"optimizer post-validation (docs/pipeline.md): every rank updates as soon as its "
               "gradients are final, while the global gradient norm is summed, and undoes and "
               "redoes the update where clipping applies (a non-finite value: undone, exit 4); "
               "bit-identical to false, with a copy of the parameters and optimizer state"}),
      choice("train", "recompute", &RC::train, &T::recompute,
             {Recompute::none, Recompute::selective, Recompute::full},
             {"activations recomputed in the backward instead of kept (docs/memory.md); every "
              "number stays bit-identical"}),
      number("train", "beta1", &RC::train, &T::beta1, 0.0, 0.999999, false,
             {"AdamW's first-moment decay"}),
      number("train", "beta2", &RC::train, &T::beta2, 0.0, 0.999999, false,
             {"AdamW's second-moment decay"}),
      number("train", "eps", &RC::train, &T::eps, 0.0, 1.0, true, {"AdamW's epsilon"}),
      integer("train", "seed", &RC::train, &T::seed, 0, max_i64,
              {"parameter init and data sampling", "yes", ">= 0"}),

      text("data", "path", &RC::data, &D::path,
           {"training token file (docs/design.md section 7; `tools/prepare-data` writes one)"},
           true),
      text("data", "val_path", &RC::data, &D::val_path,
           {"validation token file; when set, validation runs at the end (and every val_every "
            "steps)"}),
      integer("data", "val_every", &RC::data, &D::val_every, 0, kBig,
              {"steps between validations; > 0 needs val_path"}),
      integer("data", "val_batches", &RC::data, &D::val_batches, 1, 1 << 20,
              {"micro-batches per validation (fixed sequences, the same every time)"}),

      text("checkpoint", "dir", &RC::checkpoint, &K::dir,
           {"where step_NNNNNNNN.h5 files and `latest` are written"}),
      integer("checkpoint", "every", &RC::checkpoint, &K::every, 0, kBig,
              {"steps between checkpoints; 0 = only at the end (and when stopped early)"}),
      boolean("checkpoint", "async", &RC::checkpoint, &K::async,
              {"true: at a checkpoint step each rank copies its state to host memory and a "
               "writer thread saves the copy while training goes on (the same file; one save in "
               "flight: the next one, a stop or the end waits for it; docs/checkpoints.md)"}),
      integer("checkpoint", "keep", &RC::checkpoint, &K::keep, 1, 1 << 20,
              {"the newest checkpoints kept; older ones are removed after a new one is "
               "published"}),
      text("checkpoint", "resume", &RC::checkpoint, &K::resume,
           {"auto: `latest`, else the newest usable one; none: start afresh; a path: that file "
            "(exit 3 if unusable)",
            "yes", "auto, none, a path"}),
      text("checkpoint", "init_from", &RC::checkpoint, &K::init_from,
           {"a Hugging Face directory (config.json, model.safetensors of GPT2LMHeadModel or "
            "LlamaForCausalLM, F32 or BF16) whose weights start a run that does not resume "
            "(docs/models.md); \"\" = the seeded init"}),

      allreduce_key(),
      boolean("comm", "autotune", &RC::comm, &C::autotune,
              {"allreduce = auto only: the first call of each bucket size times every "
               "algorithm and keeps the fastest unless the model's choice is within 5% "
               "(docs/collectives.md); false: the model alone"}),
      choice("comm", "topology", &RC::comm, &C::topology,
             {TopologyKind::automatic, TopologyKind::flat, TopologyKind::fat_tree,
              TopologyKind::tianhe},
             {"the α/β/γ preset of the cost model; auto: `node` (shared memory) when the dp "
              "group sits on one node, else fat-tree"}),
      text("comm", "calibration", &RC::comm, &C::calibration,
           {"a file written by `pipetrain-bench calibrate`; replaces the preset (topology must "
            "stay auto); unreadable or damaged: exit 2"}),
      number("comm", "bucket_mb", &RC::comm, &C::bucket_mb, 0.0, 65536.0, false,
             {"gradient bucket size in MB (2^20 bytes), buckets in reverse layer order; 0 = no "
              "limit"}),
      choice("comm", "overlap", &RC::comm, &C::overlap,
             {Overlap::none, Overlap::thread, Overlap::poll},
             {"none: reduce after the schedule; thread: a progress thread reduces each bucket "
              "as its layers finish (needs MPI_THREAD_MULTIPLE); poll: MPI_Iallreduce per "
              "bucket, advanced between layers (needs allreduce mpi or auto); under ZeRO-1 the "
              "same modes apply to the buckets' reduce-scatter (none with sequence "
              "parallelism)"}),
      choice("comm", "alltoall", &RC::comm, &C::alltoall,
             {AlltoallKind::automatic, AlltoallKind::mpi, AlltoallKind::pairwise,
              AlltoallKind::hierarchical},
             {"parallel.ep > 1: the all-to-all that moves tokens to their experts and back "
              "(docs/collectives.md); auto: the least modelled time per size class, refined by "
              "one measurement of each candidate"}),
      integer("comm", "ranks_per_node", &RC::comm, &C::ranks_per_node, 0, 1 << 20,
              {"0: nodes found from shared memory; N: blocks of N consecutive ranks form a node "
               "(to test multi-node layouts on one machine)"}),
      choice("comm", "gpu_collectives", &RC::comm, &C::gpu_collectives,
             {GpuTransport::automatic, GpuTransport::nccl, GpuTransport::mpi},
             {"device.kind = \"cuda\" only: dp and tp reductions through NCCL on device memory "
              "or MPI on host copies; auto: nccl where the build has NCCL and no two ranks "
              "share a GPU (docs/cuda.md)"}),
      choice("comm", "gpu_p2p", &RC::comm, &C::gpu_p2p, {GpuTransport::mpi, GpuTransport::nccl},
             {"device.kind = \"cuda\" only: pipeline messages through MPI on host copies, or "
              "ncclSend/ncclRecv on device memory (docs/cuda.md)",
              "mpi yes; nccl never run (needs two GPUs)"}),

      choice("device", "kind", &RC::device, &V::kind, {DeviceKind::host, DeviceKind::cuda},
             {"host, or cuda: one GPU per rank; exit 2 where no GPU is usable (docs/cuda.md)"}),
      choice("device", "precision", &RC::device, &V::precision,
             {Precision::fp32, Precision::tf32, Precision::bf16},
             {"fp32; bf16: activations, their gradients and pipeline messages stored in bfloat16, "
              "weights, gradients and optimizer state fp32 (docs/precision.md; on CUDA the "
              "products' inputs in bf16 too); tf32: CUDA only, products on tensor cores"}),
      choice("device", "attention", &RC::device, &V::attention,
             {AttentionKind::automatic, AttentionKind::cudnn, AttentionKind::flash,
              AttentionKind::gemm},
             {"device.kind = \"cuda\" at precision bf16: cudnn (cuDNN's fused attention), flash "
              "(pipetrain's kernels, head sizes 32 and 64), gemm (cuBLAS products around a "
              "softmax); auto: cudnn where the build has it and it takes the shape, else flash "
              "where it takes the head size, else gemm (docs/cuda.md)"}),
      integer("device", "threads", &RC::device, &V::threads, 0, 1024,
              {"host threads per rank (Kokkos and the products alike; results are the same at "
               "any count); 0: OMP_NUM_THREADS if set, else the cores of the rank's affinity "
               "mask divided among the ranks sharing them (docs/running.md)"}),

      integer("log", "every", &RC::log, &L::every, 1, kBig,
              {"steps between logged steps (the first and last always log): only these print "
               "and reduce the metrics over ranks (docs/design.md section 9)"}),
      text("log", "dir", &RC::log, &L::dir,
           {"where metrics.jsonl is appended (created if missing)"}),
      boolean("log", "trace", &RC::log, &L::trace,
              {"`<log.dir>/trace.json`, a Chrome trace of every rank's actions over "
               "trace_steps (`tools/timeline` draws it; docs/pipeline.md)"}),
      trace_steps_key(),
      boolean("log", "op_profile", &RC::log, &L::op_profile,
              {"time every kernel op and copy and print a table summed over ranks at the end "
               "(docs/performance.md); the run's numbers are unchanged"}),
      boolean("log", "param_digests", &RC::log, &L::param_digests,
              {"every logged step writes each tensor's digest, sum of squares and projection "
               "(as final_params) to metrics.jsonl: comparisons of layouts name the first step "
               "and tensor that differ; a pass over the parameters a logged step"}),

      number("runtime", "hang_timeout_s", &RC::runtime, &R::hang_timeout_s, 0.0, 1e7, false,
             {"a rank waiting longer on a message or collective names it and aborts the job "
              "with exit code 5; 0 = wait forever"}),
      boolean("runtime", "deterministic", &RC::runtime, &R::deterministic,
              {"comm.allreduce = \"auto\" uses the model's choice alone, so two launches give "
               "bit-identical losses (docs/collectives.md)"}),
      integer("runtime", "exit_after_steps", &RC::runtime, &R::exit_after_steps, 0, kBig,
              {"> 0: stop after that many steps of this run, checkpoint, exit 0 (the LR "
               "schedule still follows train.steps); needs [checkpoint]"}),
  };
}

} // namespace

const std::vector<DeckKey>& deck_keys() {
  static const std::vector<DeckKey> table = make_table();
  return table;
}

std::vector<std::pair<std::string, std::string>> model_description(const ModelConfig& m) {
  RunConfig c;
  c.model = m;                 // every key, a future one too
  if (m.arch != Arch::llama) { // llama's rotary base and RMSNorm epsilon do nothing here
    c.model.rope_theta = ModelConfig{}.rope_theta;
    c.model.norm_eps = ModelConfig{}.norm_eps;
  }
  c.model.tie_embeddings = tied(m);
  c.model.n_kv_head = kv_heads(m);
  c.model.ffn_hidden = mlp_width(m);
  const ModelConfig dense;
  if (m.moe_experts == 0) { // the [moe] keys do nothing
    c.model.moe_top_k = dense.moe_top_k;
    c.model.moe_every = dense.moe_every;
    c.model.moe_shared_experts = dense.moe_shared_experts;
    c.model.moe_ffn_hidden = dense.moe_ffn_hidden;
  } else {
    c.model.moe_ffn_hidden = expert_width(m);
  }
  // training choices, not the model: a run may resume with others
  const char* const training[] = {"capacity_factor", "aux_loss", "z_loss"};
  std::vector<std::pair<std::string, std::string>> out;
  for (const DeckKey& k : deck_keys()) {
    if (k.section == "model") out.emplace_back(k.name, k.value(c));
    if (k.section == "moe" &&
        std::find(std::begin(training), std::end(training), k.name) == std::end(training)) {
      out.emplace_back("moe." + k.name, k.value(c));
    }
  }
  return out;
}

std::map<std::string, std::vector<std::string>> deck_sections() {
  std::map<std::string, std::vector<std::string>> out;
  for (const DeckKey& k : deck_keys()) out[k.section].push_back(k.name);
  return out;
}

std::string deck_keys_markdown() {
  std::string out, section;
  for (const DeckKey& k : deck_keys()) {
    if (k.section != section) {
      section = k.section;
      out += "\n### [" + section + "]\n| key | type | default | range | meaning | status |\n" +
             "|---|---|---|---|---|---|\n";
    }
    out += "| " + k.name + " | " + k.type + " | " + k.def + " | " + k.range + " | " + k.doc +
           " | " + k.status + " |\n";
  }
  return out;
}

} // namespace pt
