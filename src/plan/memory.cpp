#include "plan/memory.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "backend.hpp"
#include "comm/grad_sync.hpp"
#include "comm/layout.hpp"
#include "comm/reducers.hpp"
#include "comm/topology.hpp"
#include "cuda/device_query.hpp"
#include "model/activations.hpp"
#include "model/partition.hpp"
#include "plan/plan.hpp"
#include "util/buffer.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

using schedule::Op;

// The share of a node's (or GPU's) memory the ranks may plan to fill; the rest is for the OS,
// MPI, BLAS, CUDA and what the memory model does not count (docs/memory.md).
constexpr double kUsable = 0.9;

// Bytes of a Buffer of n floats (or int32), as util/buffer.hpp allocates them.
double buf(double n) {
  return static_cast<double>(aligned_bytes(static_cast<std::size_t>(n) * 4));
}

// The shapes of one stage of this rank, with the attention buffer of `be`, or of the host
// backend.
StageShapes shapes_of(const RunConfig& cfg, const Backend* be) {
  return backend_shapes(cfg.model, cfg.train.micro_batch, cfg.parallel.tp,
                        cfg.parallel.sequence_parallel, activation_format(cfg.device.precision),
                        be != nullptr ? *be : host_backend())
      .with_ep(cfg.parallel.ep);
}

// Floats of attention_backward's scratch: be's; without it the host's, a (T,T) tile per thread
// of the rank, at most one per (batch row, head) pair (kernels/host/ops_host.cpp)
double attention_scratch(const RunConfig& cfg, const StageShapes& s, const Backend* be) {
  if (be != nullptr) {
    return static_cast<double>(be->attention_scratch(static_cast<int>(s.B), static_cast<int>(s.T),
                                                     static_cast<int>(s.NH)));
  }
  const auto threads = static_cast<std::size_t>(std::max(1, cfg.device.threads));
  const std::size_t lanes = cfg.device.kind == DeviceKind::cuda ? 1 : std::min(threads, s.B * s.NH);
  return static_cast<double>(lanes * s.T * s.T);
}

// One micro-batch's activations of a stage (GptStage::make_activations: the same list).
double slot_bytes(const StageShapes& s, const StageSpec& spec, Recompute rc) {
  double bytes = 0.0;
  StageActivations counted;
  stage_activation_buffers(counted, s, spec, rc, CountBytes{bytes});
  return bytes;
}

// The whole-stage stash of a split backward, or backward()'s one-block stash (make_stash).
double stash_bytes(const StageShapes& s, const StageSpec& spec, int blocks) {
  double bytes = 0.0;
  StageStash counted;
  stage_stash_buffers(counted, s, spec, static_cast<std::size_t>(blocks), CountBytes{bytes});
  return bytes;
}

// A stage's workspace (GptStage's: the same list), with attention's scratch for the planned
// threads, and backward()'s one-block stash where the schedule runs fused backwards.
double workspace_bytes(const RunConfig& cfg, const StageShapes& s, const StageSpec& spec,
                       bool fused, const Backend* be) {
  double bytes = 0.0;
  StageWorkspace counted;
  stage_workspace_buffers(counted, s, spec, cfg.train.recompute,
                          static_cast<std::size_t>(attention_scratch(cfg, s, be)),
                          CountBytes{bytes});
  return bytes + (fused ? stash_bytes(s, spec, 1) : 0.0);
}

// Floats of scratch one all-reduce (comm/allreduce.cpp) keeps for buckets of at most n floats
// over p ranks, g per node: the power-of-two algorithms a copy of the bucket, ring one chunk, the
// two-level ones a row's chunk (none inside one node's shared window, which MPI allocates).
// auto's measurement runs every candidate: the largest of their scratch, and the two-level
// groups' own (one per row size); the copy of the bucket it restores from is counted apart (it
// lives only while it measures).
double allreduce_scratch(const CommConfig& cc, bool measures, double n, int p, int g) {
  if (measures) {
    double extra = 0.0;
    const int h = two_level_row(AllreduceAlgo::hierarchical, p, g),
              t = two_level_row(AllreduceAlgo::torus2d, p, 0);
    if (h > 0 && h < p && g > 1) extra += n / h;
    if (t > 0 && t < p && t != h) extra += n / t;
    return n + extra;
  }
  AllreduceAlgo algo = cc.allreduce.value_or(AllreduceAlgo::rabenseifner);
  if (!cc.allreduce) { // auto by the model alone
    try {
      const Topology t = resolve_topology(name(cc.topology), cc.calibration, p / std::max(1, g));
      algo = choose_algorithm(n * sizeof(float), p, g, t);
    } catch (const Error&) { // a bad calibration file is reported when training starts
    }
  }
  switch (algo) {
  case AllreduceAlgo::mpi:
    return 0.0;
  case AllreduceAlgo::ring:
    return n / p;
  case AllreduceAlgo::recursive_doubling:
  case AllreduceAlgo::rabenseifner:
    return n;
  case AllreduceAlgo::hierarchical:
  case AllreduceAlgo::torus2d: {
    const int c = two_level_row(algo, p, algo == AllreduceAlgo::hierarchical ? g : 0);
    if (c == 0) return n;
    if (algo == AllreduceAlgo::hierarchical && c == p) return 0.0; // one node: the window
    return n / c;
  }
  }
  return n;
}

// checkpoint.async's host copy of a chunk (checkpoint/checkpoint.hpp, Snapshot): its parameters,
// the moments of the elements its optimizer holds (every tensor's, or ZeRO-1's `shard`), and
// 2bw's older weights.
double snapshot_bytes(const RunConfig& cfg, const ParamLayout& layout, std::size_t shard) {
  if (!cfg.checkpoint.enabled || !cfg.checkpoint.async) return 0.0;
  double held = static_cast<double>(shard);
  if (cfg.parallel.zero == 0) {
    held = 0.0;
    for (const ParamTensor& t : layout.tensors()) held += static_cast<double>(t.size);
  }
  const double older = cfg.parallel.schedule == ScheduleKind::two_bw ? 1.0 : 0.0;
  return sizeof(float) * ((1.0 + older) * static_cast<double>(layout.total()) + 2.0 * held);
}

// Bytes of the all-reduces' scratch of the chunks (the largest bucket of each chunk's reducer: the
// dp one, and with ep < dp the experts' over dp / ep ranks): each reducer's own, and auto's copy
// of the bucket it measures (one at a time).
double reducers_scratch(const RunConfig& cfg, const std::vector<double>& dense_largest,
                        const std::vector<double>& expert_largest, int dp_node_size) {
  const bool measures = !cfg.comm.allreduce && cfg.comm.autotune && !cfg.runtime.deterministic;
  double floats = 0.0, saved = 0.0;
  const auto add = [&](const std::vector<double>& largest, int p, int g) {
    for (const double n : largest) {
      floats += allreduce_scratch(cfg.comm, measures, n, p, g);
      if (measures) saved = std::max(saved, n);
    }
  };
  if (cfg.parallel.zero == 0 && cfg.parallel.dp > 1 && cfg.comm.overlap != Overlap::poll &&
      cfg.device.kind != DeviceKind::cuda) {
    add(dense_largest, cfg.parallel.dp, dp_node_size);
  }
  const int edp = cfg.parallel.dp / cfg.parallel.ep; // the experts' reducers: overlap none
  if (cfg.parallel.ep > 1 && edp > 1) add(expert_largest, edp, 1);
  return sizeof(float) * (floats + saved);
}

// Bytes of the engine's message buffers on pipeline rank pp_rank: those of every list a step
// may run (schedule::message_buffers and receive_buffers' pools, the engine's; 2bw: its eight
// step lists). Host memory; none on a GPU (a received gradient's device copy lives in its slot).
double message_bytes(const RunConfig& cfg, const StageShapes& s, const schedule::Schedule& sched,
                     int pp_rank, const std::vector<schedule::ChunkUse>& use) {
  using schedule::MessageBuffer;
  const bool gpu = cfg.device.kind == DeviceKind::cuda;
  const auto me = static_cast<std::size_t>(pp_rank);
  std::vector<schedule::Schedule> two_bw; // its eight step lists, else the plan's own list
  if (cfg.parallel.schedule == ScheduleKind::two_bw) {
    two_bw = schedule::two_bw_steps(sched.p, cfg.parallel.micro_batches);
  }
  std::vector<const std::vector<schedule::Action>*> lists;
  for (const schedule::Schedule& step : two_bw) lists.push_back(&step.ranks[me]);
  if (two_bw.empty()) lists.push_back(&sched.ranks[me]);
  // a buffer per (kind, micro-batch id, chunk), counted once
  std::set<std::tuple<int, int, int>> made;
  double bytes = 0.0;
  const auto count = [&](MessageBuffer kind, const schedule::Action& a) {
    if (!made.insert({static_cast<int>(kind), a.mb, a.chunk}).second) return;
    // host memory for MPI: on a GPU none of the device's (its copies live in the slots); the
    // receives' pools apart
    if (!gpu && kind == MessageBuffer::gradient_send) bytes += buf(s.R * s.C);
  };
  std::array<int, 2> pools{0, 0};
  for (const auto* list : lists) {
    schedule::message_buffers(sched, pp_rank, *list, count);
    const std::array<int, 2> needed = schedule::receive_buffers(*list);
    for (std::size_t dir = 0; dir < 2; ++dir) pools[dir] = std::max(pools[dir], needed[dir]);
  }
  if (!gpu) bytes += (pools[0] + pools[1]) * buf(s.R * s.C);
  const std::vector<schedule::Action>& actions = sched.ranks[static_cast<std::size_t>(pp_rank)];
  // bf16 over MPI (comm/p2p.hpp): receives are widened and gradient sends packed in place; an
  // activation send is packed into a copy held until it completes, before its micro-batch's
  // slot is freed: at most one copy per live slot of a chunk that sends activations
  if (s.packed && !gpu) { // host memory: none of a GPU's
    std::set<int> sends;
    for (const schedule::Action& a : actions) {
      if (a.op == Op::SEND_ACT) sends.insert(a.chunk);
    }
    for (int c : sends) {
      bytes += 2.0 * static_cast<double>(s.R * s.C) * use[static_cast<std::size_t>(c)].peak_live;
    }
  }
  return bytes;
}

} // namespace

MemoryEstimate predict_memory(const RunConfig& cfg, const Plan& plan, int pp_rank, int dp_node_size,
                              const Backend* be) {
  const ModelConfig& m = cfg.model;
  const StageShapes s = shapes_of(cfg, be);
  const schedule::Schedule& sched = plan.schedule;
  const std::vector<schedule::Action>& actions = sched.ranks[static_cast<std::size_t>(pp_rank)];
  const std::vector<schedule::ChunkUse> use = schedule::chunk_use(actions, sched.v);
  const Recompute rc = cfg.train.recompute;
  const bool gpu = cfg.device.kind == DeviceKind::cuda;
  MemoryEstimate e;
  std::size_t zero_widest = 0;
  // each chunk's reducers: the dp one, and with ep < dp the experts' over dp / ep ranks
  std::vector<double> dense_largest, expert_largest;
  // ZeRO-1 with poll (comm/grad_sync.cpp): every bucket's blocks received from the dp ranks
  const bool zero_poll = cfg.parallel.zero == 1 && cfg.comm.overlap == Overlap::poll &&
                         cfg.parallel.dp > 1 && !cfg.parallel.sequence_parallel;
  for (int c = 0; c < sched.v; ++c) {
    const StageSpec spec = stage_spec(plan.layers, sched.stage_of(pp_rank, c));
    const int blocks = spec.layer_end - spec.layer_begin;
    const ParamLayout layout(m, spec, 0, cfg.parallel.tp, 0, cfg.parallel.ep);
    const double P = buf(static_cast<double>(layout.total()));
    e.params += 2 * P + (spec.last && tied(m) ? buf(s.V * s.C) : 0.0);
    if (cfg.parallel.schedule == ScheduleKind::two_bw) e.params += P; // the older version
    // post-validation's copies (engine/step.cpp): the parameters and the optimizer state
    const double copies = cfg.train.post_validation ? 2.0 : 1.0;
    if (cfg.train.post_validation) e.params += P;
    const auto bucket_floats = static_cast<std::size_t>(cfg.comm.bucket_mb * 262144.0);
    const std::vector<GradBucket> buckets =
        make_buckets(layout, bucket_floats, [](const ParamTensor& t) { return !t.expert; });
    std::size_t mine = 0, experts = 0;
    for (const GradBucket& k : buckets) mine = std::max(mine, k.count);
    if (cfg.parallel.ep > 1) { // the experts' own buckets
      for (const GradBucket& k :
           make_buckets(layout, bucket_floats, [](const ParamTensor& t) { return t.expert; })) {
        experts = std::max(experts, k.count);
      }
    }
    dense_largest.push_back(static_cast<double>(mine));
    expert_largest.push_back(static_cast<double>(experts));
    std::size_t shard = 0;        // ZeRO-1's elements of the chunk on this rank
    if (cfg.parallel.zero == 1) { // optim/zero_adamw.hpp: this rank's blocks of every padded bucket
      const auto dp = static_cast<std::size_t>(cfg.parallel.dp);
      for (const GradBucket& k : buckets) {
        shard += (k.count + dp - 1) / dp;
        zero_widest = std::max(zero_widest, (k.count + dp - 1) / dp * dp);
        if (zero_poll) e.comm += sizeof(float) * static_cast<double>((k.count + dp - 1) / dp * dp);
      }
      e.optimizer += copies * 2 * buf(static_cast<double>(shard));
      // the summed gradients of the blocks (post-validation: and their copy)
      e.comm += copies * buf(static_cast<double>(shard));
    } else {
      e.optimizer += copies * 2 * P;
    }
    e.snapshot += snapshot_bytes(cfg, layout, shard);
    const schedule::ChunkUse& u = use[static_cast<std::size_t>(c)];
    const bool split = u.split, fused = u.whole;
    const int peak = u.peak_live;
    // the slot: activations, a split backward's stash, the gradient of its output where kept
    const double slot =
        slot_bytes(s, spec, rc) + (split ? stash_bytes(s, spec, blocks) : 0.0) +
        (schedule::slot_keeps_gradient(sched, pp_rank, c, gpu) ? buf(s.R * s.C) : 0.0);
    e.per_slot += slot;
    e.slots = std::max(e.slots, peak);
    e.activations += peak * slot;
    e.workspace += workspace_bytes(cfg, s, spec, fused, be);
  }
  e.messages = message_bytes(cfg, s, sched, pp_rank, use);
  // ZeRO-1: the optimizer's padded bucket for the all-gather and, without poll, the
  // reduce-scatter's padded bucket and scratch; else the dp all-reduce's scratch
  e.comm += (zero_poll ? 1.0 : 3.0) * sizeof(float) * static_cast<double>(zero_widest);
  e.comm += reducers_scratch(cfg, dense_largest, expert_largest, dp_node_size);
  return e;
}

double memory_limit(const RunConfig& cfg, MPI_Comm world, std::string& source) {
  const int on_node = physical_node(world).second;
  char text[160];
  if (cfg.device.kind == DeviceKind::cuda) {
    std::string why;
    const int gpus = std::max(1, cuda::device_count(why));
    const double gpu = cuda::device_memory_bytes(0);
    if (gpu <= 0.0) { // no usable GPU: opening the backend says why
      source = "no GPU to measure: not checked";
      return std::numeric_limits<double>::infinity();
    }
    const int sharing = (on_node + gpus - 1) / gpus; // ranks per GPU
    std::snprintf(text, sizeof text, "90%% of GPU memory %.1f GiB / %d rank(s) on the GPU",
                  gpu / 1073741824.0, sharing);
    source = text;
    return kUsable * gpu / sharing;
  }
  double node = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  const char* what = "node memory";
  std::ifstream cg("/sys/fs/cgroup/memory.max"); // a job's cgroup (Slurm, containers)
  double limit = 0.0;
  if (cg >> limit && limit > 0.0 && limit < node) {
    node = limit;
    what = "the cgroup's memory.max";
  }
  // what the kernel can give now (other jobs' and the OS's memory excluded)
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kib = 0.0;
    if (key == "MemAvailable:" && meminfo >> kib) {
      if (kib * 1024.0 < node) {
        node = kib * 1024.0;
        what = "the node's available memory";
      }
      break;
    }
    meminfo.ignore(256, '\n');
  }
  std::snprintf(text, sizeof text, "90%% of %s %.1f GiB / %d rank(s) on the node", what,
                node / 1073741824.0, on_node);
  source = text;
  return kUsable * node / on_node;
}

namespace {

// What to change so that estimate e fits in `limit` bytes: its largest part.
std::string fit_hint(const RunConfig& cfg, const MemoryEstimate& e, double limit) {
  std::ostringstream msg;
  if (e.snapshot > 0.0 && e.total() - e.snapshot <= limit) {
    msg << "set checkpoint.async = false: the host copy of the state a save writes is what does "
           "not fit";
    return msg.str();
  }
  const double state = e.params + e.optimizer;
  if (state >= e.activations) {
    msg << "split the model over more ranks: its parameters, gradients and optimizer state "
           "alone need "
        << std::fixed << std::setprecision(0) << std::ceil(state / limit)
        << " times this rank's share, so a parallel.pp or parallel.tp that many times larger";
  } else {
    msg << "cut the activations: "
        << (cfg.train.recompute != Recompute::full ? "train.recompute = \"full\", " : "")
        << "a smaller train.micro_batch, or a larger parallel.pp or parallel.tp";
  }
  return msg.str();
}

} // namespace

void check_fit(const RunConfig& cfg, const Layout& layout, const Plan& plan) {
  const MemoryEstimate& e = plan.memory[static_cast<std::size_t>(layout.coords().pp)];
  std::optional<Error> err;
  if (e.total() > plan.memory_limit) {
    const double gib = 1073741824.0;
    std::ostringstream msg;
    msg << std::fixed << std::setprecision(2);
    msg << "the layout does not fit in memory: pipeline rank " << layout.coords().pp
        << " needs about " << e.total() / gib << " GiB per rank (parameters and gradients "
        << e.params / gib << ", optimizer state " << e.optimizer / gib << ", activations "
        << e.activations / gib << " for " << e.slots << " live micro-batch(es), pipeline buffers "
        << e.messages / gib << ", workspace " << (e.workspace + e.comm) / gib;
    if (e.snapshot > 0.0) msg << ", checkpoint.async's copy of the state " << e.snapshot / gib;
    msg << " GiB), and a rank has " << plan.memory_limit / gib << " GiB (" << plan.memory_source
        << ").\n---> HINT: to fit, " << fit_hint(cfg, e, plan.memory_limit);
    msg << "; docs/memory.md";
    err = input_error(msg.str());
  }
  agree(layout.world(), err);
}

} // namespace pt
