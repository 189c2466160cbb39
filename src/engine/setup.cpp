// A run's setup before the first step: backend, data, metrics log, chunks, reducers, pipeline
// engine, gradient reductions.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "comm/allreduce.hpp"
#include "comm/group.hpp"
#include "comm/reducers.hpp"
#include "cuda/device_query.hpp"
#include "engine/run.hpp"
#include "ops.hpp"
#include "optim/adamw.hpp"
#include "optim/zero_adamw.hpp"
#include "profile.hpp"
#include "telemetry/peak.hpp"
#include "util/errors.hpp"
#include "util/test_hooks.hpp"

namespace pt {
namespace {

// parallel.schedule = "search": the schedule found, as <log.dir>/schedule.csv (rank 0), which
// parallel.schedule = "file:PATH" runs again.
void write_found_schedule(const RunConfig& cfg, const schedule::Schedule& s) {
  const std::string path = cfg.log.dir + "/schedule.csv";
  std::FILE* f = std::fopen(path.c_str(), "w");
  const std::string text = schedule::to_csv(s);
  if (f == nullptr || std::fputs(text.c_str(), f) < 0 || std::fclose(f) != 0) {
    std::fprintf(stderr, "pipetrain: warning: cannot write the schedule found to %s\n",
                 path.c_str());
    return;
  }
  std::printf("  schedule found by search: %s (parallel.schedule = \"file:%s\" runs it again)\n",
              path.c_str(), path.c_str());
}

// Opens a token file on every rank; the first rank that fails reports for all.
std::unique_ptr<TokenFile> open_collectively(MPI_Comm comm, const std::string& path, int vocab,
                                             int seq_len) {
  std::unique_ptr<TokenFile> f;
  std::optional<Error> err;
  try {
    f = std::make_unique<TokenFile>(path, vocab, seq_len + 1);
  } catch (const Error& e) {
    err = e;
  }
  agree(comm, err);
  return f;
}

// The kernel backend of device.kind. CUDA: one GPU per rank, chosen by the rank's index among
// the ranks of its node (several ranks share a GPU when there are more ranks than GPUs). Every
// rank reaches the same verdict; a failure is an input error naming the fix.
// PIPETRAIN_TEST_STAGED=1 (tests) gives the host backend with MPI staging.
const Backend& open_device(const DeviceConfig& d, MPI_Comm world) {
  if (d.kind != DeviceKind::cuda) {
    // test switches: the GPU backend's host staging of MPI traffic, and its bf16 products, on
    // the host
    if (test_hooks().bf16_products) return host_bf16_products_backend();
    return test_hooks().staged ? host_staged_backend() : host_backend();
  }
  const int local = physical_node(world).first;
  const Backend* be = nullptr;
  std::optional<Error> err;
  std::string why;
  const int n = cuda::device_count(why);
  if (n == 0) {
    err = input_error("device.kind = \"cuda\": no usable GPU (" + why +
                      "); use device.kind=\"host\"");
  } else {
    try {
      be = &cuda::start(local % n, name(d.precision), name(d.attention));
    } catch (const std::exception& e) {
      err = input_error("device.kind = \"cuda\": GPU " + std::to_string(local % n) +
                        " could not be started: " + e.what() + "; use device.kind=\"host\"");
    }
  }
  agree(world, err);
  return *be;
}

// parallel.ep > 1: the all-to-all of the expert-parallel group, comm.alltoall's algorithm with
// the group's placement on nodes; prints the choice on rank 0.
std::unique_ptr<Alltoaller> make_ep_exchange(const RunConfig& cfg, const Layout& layout,
                                             const Watchdog& watchdog) {
  AlltoallOptions opt;
  if (cfg.comm.alltoall != AlltoallKind::automatic) {
    opt.algo = parse_alltoall(name(cfg.comm.alltoall));
  }
  const int count = layout.ep_nodes();
  opt.node_size = layout.ep_node_size();
  opt.topology = resolve_topology(name(cfg.comm.topology), cfg.comm.calibration, count);
  opt.autotune = cfg.comm.autotune;
  opt.watchdog = &watchdog;
  opt.what = "the expert-parallel all-to-all";
  if (layout.rank() == 0) {
    std::printf("  expert parallelism: ep %d (%d expert(s) a rank), tokens exchanged by the "
                "all-to-all %s over %d node(s)\n",
                layout.ep(), cfg.model.moe_experts / layout.ep(), name(cfg.comm.alltoall), count);
    std::fflush(stdout);
  }
  return std::make_unique<Alltoaller>(layout.ep_comm(), opt);
}

// Expert parallelism with ep < dp: the chunk's experts' gradients summed over the
// expert-data-parallel group (its ranks one each ep apart in dp: one rank a node to the model)
// at the end of the step.
void make_expert_sync(const Layout& layout, Chunk& c, AllreduceOptions opt,
                      std::size_t bucket_floats) {
  opt.node_size = 1;
  opt.what = "the experts' gradient all-reduce (expert-data-parallel group)";
  c.set_expert_reducer(
      std::make_unique<GradSync>(c.stage().grads(),
                                 make_buckets(c.stage().layout(), bucket_floats,
                                              [](const ParamTensor& t) { return t.expert; }),
                                 layout.expert_dp_comm(), Overlap::none, opt, c.stage().backend()));
}

// ZeRO-1: each chunk's reducer reduce-scatters the optimizer's buckets into its shard.
void make_zero_syncs(const RunConfig& cfg, const Layout& layout, std::vector<Chunk>& chunks,
                     Overlap overlap, const AllreduceOptions& opt) {
  for (Chunk& c : chunks) {
    c.set_reducer(std::make_unique<GradSync>(
        c.stage().grads(),
        make_buckets(c.stage().layout(), static_cast<std::size_t>(cfg.comm.bucket_mb * 262144.0)),
        layout.dp_comm(), overlap, opt, c.stage().backend(), nullptr,
        dynamic_cast<ZeroAdamW&>(c.optimizer()).shard_target()));
  }
  if (layout.rank() == 0) {
    std::printf("  dp gradient reduction: ZeRO-1 over %d rank(s): buckets reduce-scattered "
                "(overlap %s), AdamW on this rank's blocks, parameters all-gathered\n",
                layout.dp(), name(overlap));
    std::fflush(stdout);
  }
}

// The data-parallel gradient reduction of each chunk (none without data parallelism): buckets,
// algorithm, topology model and overlap mode from [comm]; prints the choice on rank 0.
void make_grad_syncs(const RunConfig& cfg, const Layout& layout, std::vector<Chunk>& chunks,
                     const Watchdog& watchdog, bool nccl) {
  const CommConfig& cc = cfg.comm;
  AllreduceOptions opt;
  opt.algo = cc.allreduce;
  opt.autotune = cc.autotune && !cfg.runtime.deterministic;
  opt.node_size = layout.dp_node_size();
  const int nodes = layout.dp_nodes();
  std::optional<Error> err;
  try { // read a calibration file even without data parallelism: a wrong path is an error
    opt.topology = resolve_topology(name(cc.topology), cc.calibration, nodes);
  } catch (const Error& e) {
    err = e;
  }
  agree(layout.world(), err);
  const bool zero = cfg.parallel.zero == 1;
  if (layout.dp() < 2 && !zero) return;
  // ZeRO-1 with sequence parallelism: the norms' tp sums come before the reduce-scatter, so no
  // bucket starts during the backward
  const Overlap overlap =
      layout.dp() < 2 || (zero && cfg.parallel.sequence_parallel) ? Overlap::none : cc.overlap;
  if (overlap == Overlap::thread) {
    const int provided = thread_level();
    if (provided < MPI_THREAD_MULTIPLE) {
      throw input_error("comm.overlap = \"thread\" needs an MPI library with "
                        "MPI_THREAD_MULTIPLE, and this one provides level " +
                        std::to_string(provided) +
                        ".\n---> HINT: use comm.overlap = \"poll\" or \"none\"");
    }
  }
  opt.watchdog = &watchdog;
  opt.what = "the data-parallel gradient all-reduce";
  if (zero) return make_zero_syncs(cfg, layout, chunks, overlap, opt);
  const std::size_t bucket_floats = static_cast<std::size_t>(cc.bucket_mb * 262144.0);
  std::size_t buckets = 0, largest = 0;
  // expert parallelism: the experts' shards over the expert-data-parallel group, the rest over dp
  const auto dense = [](const ParamTensor& t) { return !t.expert; };
  for (Chunk& c : chunks) {
    if (layout.ep() > 1 && layout.ep() < layout.dp())
      make_expert_sync(layout, c, opt, bucket_floats);
    std::vector<GradBucket> b = make_buckets(c.stage().layout(), bucket_floats, dense);
    buckets += b.size();
    for (const GradBucket& k : b) largest = std::max(largest, k.count);
    std::unique_ptr<cuda::NcclComm> device; // a communicator per chunk, on a side stream
    if (nccl) device = make_nccl(layout.dp_comm(), true, layout.world());
    c.set_reducer(std::make_unique<GradSync>(c.stage().grads(), std::move(b), layout.dp_comm(),
                                             overlap, opt, c.stage().backend(), std::move(device)));
  }
  if (layout.rank() == 0 && nccl) {
    std::printf("  dp gradient all-reduce: NCCL on device memory over %d rank(s), on a side "
                "stream as buckets become final; %zu bucket(s) per dp group, largest %.2f MiB\n",
                layout.dp(), buckets, static_cast<double>(largest) * sizeof(float) / 1048576.0);
    std::fflush(stdout);
  } else if (layout.rank() == 0) {
    const double bytes = static_cast<double>(largest) * sizeof(float);
    std::printf(
        "  dp gradient all-reduce: %s%s over %d rank(s) in %d node(s), topology %s; "
        "%zu bucket(s) per dp group, largest %.2f MiB; overlap %s\n",
        cc.allreduce ? algorithm_name(*cc.allreduce) : "auto",
        opt.algo
            ? ""
            : (std::string(" (") +
               algorithm_name(choose_algorithm(bytes, layout.dp(), opt.node_size, opt.topology)) +
               (cc.autotune ? " by the model for the largest bucket, measured "
                              "on the first steps)"
                            : " for the largest bucket)"))
                  .c_str(),
        layout.dp(), nodes, opt.topology.name.c_str(), buckets, bytes / 1048576.0, name(overlap));
    std::fflush(stdout);
  }
}

} // namespace

// The backend of device.kind, wrapped in the op timer when log.op_profile is on.
const Backend& open_backend(const RunConfig& cfg, MPI_Comm world) {
  const Backend& be = open_device(cfg.device, world);
  return cfg.log.op_profile ? profiled_backend(be) : be;
}

// This rank's chunks (chunk c: virtual stage schedule.stage_of(pp, c)) with their optimizers and
// reducers, and the tensors each chunk's gradient norm counts. Every tensor of the model has one
// index, so the norm is summed in one order in every layout (bit-identical to the single-rank run).
void Trainer::make_chunks() {
  const RunConfig& cfg = cfg_;
  const Layout& layout = layout_;
  const int me = layout.coords().pp;
  if (layout.tp() > 1) {
    tp_reduce_ = make_reducer(
        layout.tp_comm(),
        "the tensor-parallel all-reduce (tp group of pipeline rank " + std::to_string(me) + ")",
        watchdog_, be_, nccl_ ? make_nccl(layout.tp_comm(), false, layout.world()) : nullptr);
  }
  // (V placement: the embedding and the head share rank 0, step.cpp sums them there)
  if (layout.embedding_comm() != MPI_COMM_NULL && tied(cfg.model) && !plan_.schedule.vshape) {
    embedding_reduce_ = make_reducer(layout.embedding_comm(),
                                     "the tied-embedding gradient all-reduce", watchdog_, be_);
  }
  if (layout.ep() > 1) ep_exchange_ = make_ep_exchange(cfg, layout, watchdog_);
  for (int c = 0; c < cfg.parallel.virtual_stages; ++c) {
    const TpGroup tp{layout.coords().tp, layout.tp(), tp_reduce_.get(),
                     cfg.parallel.sequence_parallel};
    auto stage = std::make_unique<GptStage>(
        cfg.model, stage_spec(plan_.layers, plan_.schedule.stage_of(me, c)), cfg.train.micro_batch,
        tp, be_, cfg.train.recompute, activation_format(cfg.device.precision),
        EpGroup{layout.ep_rank(), layout.ep(), ep_exchange_.get()});
    stage->init_parameters(cfg.train.seed);
    std::unique_ptr<Optimizer> opt;
    if (cfg.parallel.zero == 1) {
      opt = std::make_unique<ZeroAdamW>(stage->layout(),
                                        static_cast<std::size_t>(cfg.comm.bucket_mb * 262144.0),
                                        layout.dp_comm(), watchdog_, cfg.train, be_);
    } else {
      opt = std::make_unique<AdamW>(stage->layout(), cfg.train, be_);
    }
    chunks_.emplace_back(std::move(stage), std::move(opt));
    chunks_.back().count_in_norm(whole_);
  }
}

Trainer::Trainer(const RunConfig& cfg, const Layout& layout, const Plan& plan)
    : cfg_(cfg), layout_(layout), plan_(plan), be_(open_backend(cfg, layout.world())),
      watchdog_(cfg.runtime.hang_timeout_s, layout.rank()),
      whole_(cfg.model, StageSpec{true, true, 0, cfg.model.n_layer}),
      trace_(cfg.log.trace, cfg.log.trace_first, cfg.log.trace_last) {
  const ModelConfig& m = cfg.model;
  data_ = open_collectively(layout.world(), cfg.data.path, m.vocab_size, m.seq_len);
  if (!cfg.data.val_path.empty()) {
    val_data_ = open_collectively(layout.world(), cfg.data.val_path, m.vocab_size, m.seq_len);
  }
  std::optional<Error> log_err;
  try {
    log_ = std::make_unique<MetricsLog>(cfg.log.dir, layout.rank() == 0);
  } catch (const Error& e) {
    log_err = e;
  }
  agree(layout.world(), log_err);
  if (cfg.parallel.schedule == ScheduleKind::search && layout.rank() == 0) {
    write_found_schedule(cfg, plan.schedule);
  }
  nccl_ =
      use_nccl("comm.gpu_collectives", cfg.comm.gpu_collectives, cfg, layout.world(), staged_why_);
  make_chunks();
  policy_ = make_step_policy(cfg, plan.schedule, layout.coords().pp, stages_of(chunks_), be_);
  const int p = cfg.parallel.pp;
  nccl_p2p_ = p > 1 && use_nccl("comm.gpu_p2p", cfg.comm.gpu_p2p, cfg, layout.world(), p2p_why_);
  engine_ = std::make_unique<PipelineEngine>(
      cfg, layout, plan.schedule, stages_of(chunks_), watchdog_, *policy_,
      nccl_p2p_ ? make_nccl_links(plan.schedule, layout)
                : std::vector<std::unique_ptr<cuda::NcclLink>>{});
  make_grad_syncs(cfg, layout, chunks_, watchdog_, nccl_);
  if (cfg.checkpoint.enabled && cfg.checkpoint.async) {
    async_writer_ = std::make_unique<AsyncWriter>(layout, cfg.runtime.hang_timeout_s);
  }
  std::vector<GradSync*> syncs;
  for (const Chunk& c : chunks_) syncs.push_back(c.reducer());
  engine_->set_grad_sync(syncs);
  if (cfg.log.trace) engine_->set_trace(&trace_);
  // MFU denominator: every rank's measured matrix-product rate (host sgemm, or cuBLAS at the
  // deck's precision), summed. Ranks sharing a GPU each count it: MFU is then understated.
  const bool quick = test_hooks().quick_peak;
  peak_flops_ = cfg.device.kind == DeviceKind::cuda ? cuda::measure_gemm_flops(quick ? 0.01 : 0.25)
                : quick                             ? measure_sgemm_flops(0.01, 256)
                                                    : measure_sgemm_flops(0.25);
  watchdog_.allreduce(&peak_flops_, 1, MPI_DOUBLE, MPI_SUM, layout.world(),
                      "the sum of the ranks' measured peak rates");
}

void Trainer::print_header() const {
  if (layout_.rank() != 0) return;
  const Backend& be = be_;
  const bool gpu = cfg_.device.kind == DeviceKind::cuda;
  std::printf("== run ==\n  kernels %s; %d host thread(s) on rank 0; measured %s peak %.1f "
              "GFLOP/s (all ranks); metrics -> %s\n",
              be.name, ops::host_threads(), gpu ? "cuBLAS 4096^3 GEMM" : "sgemm", peak_flops_ / 1e9,
              log_->path().c_str());
  if (!be.on_host() && (layout_.dp() > 1 || layout_.tp() > 1)) {
    std::printf("  GPU dp/tp reductions: %s\n",
                nccl_ ? "NCCL on device memory"
                      : ("MPI on host copies (" + staged_why_ + ")").c_str());
  }
  if (!be.on_host() && layout_.pp() > 1) {
    std::printf("  GPU pipeline messages: %s\n",
                nccl_p2p_ ? "NCCL send/receive on device memory"
                          : ("MPI on host copies (" + p2p_why_ + ")").c_str());
  }
  std::fflush(stdout);
}

} // namespace pt
