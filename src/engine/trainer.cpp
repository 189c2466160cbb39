#include "engine/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "checkpoint/checkpoint.hpp"
#include "comm/allreduce.hpp"
#include "comm/grad_sync.hpp"
#include "comm/reducers.hpp"
#include "comm/watchdog.hpp"
#include "cuda/device_query.hpp"
#include "cuda/nccl.hpp"
#include "data/sampler.hpp"
#include "data/token_file.hpp"
#include "engine/pipeline.hpp"
#include "model/gpt_stage.hpp"
#include "model/partition.hpp"
#include "ops.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "profile.hpp"
#include "schedule/schedule.hpp"
#include "schedule/validate.hpp"
#include "telemetry/metrics.hpp"
#include "telemetry/peak.hpp"
#include "util/errors.hpp"
#include "util/hash.hpp"
#include "util/test_hooks.hpp"

namespace pt {
namespace {

// SIGTERM / SIGUSR1 (what Slurm sends ahead of the time limit with --signal) ask the run to
// finish the step, checkpoint and exit 0. main() blocks both in every thread before MPI starts;
// they stay pending until this poll collects them after a step, so no handler ever runs inside
// MPI, PMIx or BLAS code. Returns the signal, or 0.
int poll_stop_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  const timespec zero{0, 0};
  const int sig = sigtimedwait(&set, nullptr, &zero);
  return sig > 0 ? sig : 0;
}

constexpr std::uint64_t kValidationStream = 0x76616c69646174ULL; // "validat": sampler stream

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
  if (d.kind != "cuda") {
    // test switch: the GPU backend's host staging of MPI traffic, on the host
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
      be = &cuda::start(local % n, d.precision);
    } catch (const std::exception& e) {
      err = input_error("device.kind = \"cuda\": GPU " + std::to_string(local % n) +
                        " could not be started: " + e.what() + "; use device.kind=\"host\"");
    }
  }
  agree(world, err);
  return *be;
}

// The backend of device.kind, wrapped in the op timer when log.op_profile is on.
const Backend& open_backend(const RunConfig& cfg, MPI_Comm world) {
  const Backend& be = open_device(cfg.device, world);
  return cfg.log.op_profile ? profiled_backend(be) : be;
}

// log.op_profile: each op's calls and time, summed over all ranks, largest first, against the
// ranks' summed step time.
void print_op_profile(const Layout& layout, int steps, bool after_first, double steps_s) {
  std::vector<OpTime> ops = op_times();
  std::vector<double> sec(ops.size() + 1), calls(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    sec[i] = ops[i].seconds;
    calls[i] = static_cast<double>(ops[i].calls);
  }
  sec.back() = steps_s;
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, sec.data(), static_cast<int>(sec.size()), MPI_DOUBLE, MPI_SUM,
                       layout.world()));
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, calls.data(), static_cast<int>(calls.size()), MPI_DOUBLE,
                       MPI_SUM, layout.world()));
  if (layout.rank() != 0) return;
  double all = 0.0;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    all += sec[i];
    if (calls[i] > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return sec[a] > sec[b]; });
  std::printf("op profile (log.op_profile; %d step(s)%s, %d rank(s), each op timed between two "
              "synchronizes):\n  %-26s %10s %12s %8s %10s\n",
              steps, after_first ? " after the first" : "", layout.size(), "op", "calls",
              "total ms", "% ops", "mean us");
  for (std::size_t i : order) {
    std::printf("  %-26s %10.0f %12.3f %7.1f%% %10.2f\n", ops[i].name, calls[i], 1e3 * sec[i],
                all > 0.0 ? 100.0 * sec[i] / all : 0.0, 1e6 * sec[i] / calls[i]);
  }
  std::printf("  all ops: %.3f ms of %.3f ms of steps, summed over ranks (%.1f%%); the rest is "
              "communication, waiting and host work\n",
              1e3 * all, 1e3 * sec.back(), sec.back() > 0.0 ? 100.0 * all / sec.back() : 0.0);
  std::fflush(stdout);
}

int blas_threads_for(const DeviceConfig& d, const Layout& layout) {
  if (d.blas_threads > 0) return d.blas_threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, layout.ranks_on_node()));
}

double flops_per_token(const ModelConfig& m) {
  return 6.0 * static_cast<double>(count_model_params(m)) +
         6.0 * m.n_layer * m.d_model * static_cast<double>(m.seq_len);
}

// Seconds of forward + backward of one micro-batch through a stage of this shape.
double time_stage(const RunConfig& cfg, const StageSpec& spec, const Backend& be) {
  GptStage stage(cfg.model, spec, cfg.train.micro_batch, TpGroup{}, be);
  stage.init_parameters(cfg.train.seed);
  StageActivations a = stage.make_activations();
  FloatBuffer dout(a.input.size(), Memory{be.alloc, be.release});
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) { // best of 3 after the first (cold) one
    const double t0 = MPI_Wtime();
    stage.forward(a);
    stage.backward(a, spec.last ? nullptr : dout.data(), 1e-3f, nullptr);
    if (rep > 0) best = std::min(best, MPI_Wtime() - t0);
  }
  return best;
}

// partition = "time": forward+backward of the embedding, one layer and the head, measured on
// every rank's hardware and averaged, so every rank derives the same partition.
BlockCosts profile_costs(const RunConfig& cfg, MPI_Comm world) {
  const int L = cfg.model.n_layer;
  const Backend& be = open_backend(cfg, world);
  double t[3] = {time_stage(cfg, StageSpec{true, false, 0, 0}, be),
                 time_stage(cfg, StageSpec{false, false, 0, 1}, be),
                 time_stage(cfg, StageSpec{false, true, L, L}, be)};
  int n = 1;
  PT_MPI(MPI_Comm_size(world, &n));
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, t, 3, MPI_DOUBLE, MPI_SUM, world));
  return BlockCosts{t[0] / n, t[1] / n, t[2] / n};
}

// The data-parallel gradient reduction of each chunk (none without data parallelism): buckets,
// algorithm, topology model and overlap mode from [comm]; prints the choice on rank 0.
std::vector<std::unique_ptr<GradSync>>
make_grad_syncs(const RunConfig& cfg, const Layout& layout,
                std::vector<std::unique_ptr<GptStage>>& chunks, const Watchdog& watchdog,
                bool nccl) {
  std::vector<std::unique_ptr<GradSync>> syncs;
  const CommConfig& cc = cfg.comm;
  AllreduceOptions opt;
  opt.algo = parse_allreduce(cc.allreduce);
  opt.autotune = cc.autotune && !cfg.runtime.deterministic;
  // the dp group's ranks per node (a node holds ranks_on_node / (pp*tp) replicas of a stage)
  opt.node_size = std::max(1, layout.ranks_on_node() / (layout.pp() * layout.tp()));
  const int nodes = std::max(1, layout.dp() / opt.node_size);
  std::optional<Error> err;
  try { // read a calibration file even without data parallelism: a wrong path is an error
    opt.topology = resolve_topology(cc.topology, cc.calibration, nodes);
  } catch (const Error& e) {
    err = e;
  }
  agree(layout.world(), err);
  if (layout.dp() < 2) return syncs;
  if (cc.overlap == "thread") {
    int provided = MPI_THREAD_SINGLE;
    PT_MPI(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_MULTIPLE) {
      throw input_error("comm.overlap = \"thread\" needs an MPI library with "
                        "MPI_THREAD_MULTIPLE, and this one provides level " +
                        std::to_string(provided) +
                        ".\n---> HINT: use comm.overlap = \"poll\" or \"none\"");
    }
  }
  opt.watchdog = &watchdog;
  opt.what = "the data-parallel gradient all-reduce";
  const std::size_t bucket_floats = static_cast<std::size_t>(cc.bucket_mb * 262144.0);
  std::size_t buckets = 0, largest = 0;
  for (auto& c : chunks) {
    std::vector<GradBucket> b = make_buckets(c->layout(), bucket_floats);
    buckets += b.size();
    for (const GradBucket& k : b) largest = std::max(largest, k.count);
    std::unique_ptr<cuda::NcclComm> device; // a communicator per chunk, on a side stream
    if (nccl) device = make_nccl(layout.dp_comm(), true, layout.world());
    syncs.push_back(std::make_unique<GradSync>(c->grads(), std::move(b), layout.dp_comm(),
                                               cc.overlap, opt, c->backend(), std::move(device)));
  }
  if (layout.rank() == 0 && nccl) {
    std::printf("  dp gradient all-reduce: NCCL on device memory over %d rank(s), on a side "
                "stream as buckets become final; %zu bucket(s) per dp group, largest %.2f MiB\n",
                layout.dp(), buckets, static_cast<double>(largest) * sizeof(float) / 1048576.0);
    std::fflush(stdout);
  } else if (layout.rank() == 0) {
    const double bytes = static_cast<double>(largest) * sizeof(float);
    std::printf("  dp gradient all-reduce: %s%s over %d rank(s) in %d node(s), topology %s; "
                "%zu bucket(s) per dp group, largest %.2f MiB; overlap %s\n",
                cc.allreduce.c_str(),
                opt.algo ? ""
                         : (std::string(" (") +
                            algorithm_name(
                                choose_algorithm(bytes, layout.dp(), opt.node_size, opt.topology)) +
                            (cc.autotune ? " by the model for the largest bucket, measured "
                                           "on the first steps)"
                                         : " for the largest bucket)"))
                               .c_str(),
                layout.dp(), nodes, opt.topology.name.c_str(), buckets, bytes / 1048576.0,
                cc.overlap.c_str());
    std::fflush(stdout);
  }
  return syncs;
}

// Every replicated tensor's gradient must be the same bytes on every tp rank (by construction:
// replicated parameters see replicated inputs). Compares min and max over the tp group.
void check_replicated_grads(std::vector<std::unique_ptr<GptStage>>& chunks, const Layout& layout,
                            int step, int& checked) {
  if (layout.tp() < 2) return;
  int count = 0;
  for (auto& c : chunks) {
    for (const auto& t : c->layout().tensors()) {
      if (t.shard_dim >= 0) continue;
      const float* g = c->grads() + t.offset;
      std::vector<float> lo(g, g + t.size), hi(g, g + t.size);
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, lo.data(), static_cast<int>(t.size), MPI_FLOAT, MPI_MIN,
                           layout.tp_comm()));
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, hi.data(), static_cast<int>(t.size), MPI_FLOAT, MPI_MAX,
                           layout.tp_comm()));
      if (std::memcmp(lo.data(), hi.data(), t.size * sizeof(float)) != 0) {
        fatal("step " + std::to_string(step + 1) + ": the gradient of replicated tensor " + t.name +
              " differs between tp ranks");
      }
      ++count;
    }
  }
  checked = count;
}

} // namespace

Plan make_plan(const RunConfig& cfg, const Layout& layout, bool profile) {
  Plan plan;
  const int S = cfg.parallel.pp * cfg.parallel.virtual_stages;
  plan.costs = parameter_costs(cfg.model);
  plan.cost_unit = "parameters";
  if (cfg.parallel.partition == "time") {
    if (profile) {
      plan.costs = profile_costs(cfg, layout.world());
      plan.cost_unit = "seconds (measured fwd+bwd)";
    } else {
      plan.cost_unit = "parameters (time is profiled when training starts)";
    }
  }
  plan.layers = partition_layers(cfg.parallel, cfg.model.n_layer, S, plan.costs);
  try {
    plan.schedule =
        schedule::make_schedule(cfg.parallel.schedule, cfg.parallel.pp, cfg.parallel.micro_batches,
                                cfg.parallel.virtual_stages);
  } catch (const std::invalid_argument& e) {
    throw input_error(cfg.deck_path + ": parallel.schedule = \"" + cfg.parallel.schedule +
                      "\" does not fit this run: " + e.what());
  }
  const schedule::Validation v = schedule::validate(plan.schedule);
  if (!v.ok) fatal("internal error: generated schedule is invalid: " + v.error);
  plan.peak_live = v.peak_live;
  plan.predicted = schedule::simulate(plan.schedule, schedule::Costs{1, 2, 1, 1, 0});
  return plan;
}

void print_plan(const RunConfig& cfg, const Layout& layout, const Plan& plan) {
  const std::string table = layout.table();
  if (layout.rank() != 0) return;
  const auto& m = cfg.model;
  std::printf("== resolved deck (%s) ==\n%s\n\n", cfg.deck_path.c_str(), cfg.resolved_text.c_str());
  std::printf("== layout ==\n%s%s", table.c_str(), layout.warnings().c_str());
  const std::vector<double> cost = stage_costs(plan.layers, plan.costs);
  std::printf("== partition (%s, cost in %s) ==\n", cfg.parallel.partition.c_str(),
              plan.cost_unit.c_str());
  for (std::size_t s = 0; s < plan.layers.size(); ++s) {
    const StageSpec sp = stage_spec(plan.layers, static_cast<int>(s));
    std::printf("  stage %2zu (pp rank %d, chunk %d): %s layers %d-%d%s  cost %.4g\n", s,
                plan.schedule.rank_of(static_cast<int>(s)),
                plan.schedule.chunk_of(static_cast<int>(s)), sp.first ? "embedding +" : "",
                sp.layer_begin, sp.layer_end - 1, sp.last ? " + final norm/head/loss" : "",
                cost[s]);
  }
  const long long tokens = static_cast<long long>(cfg.train.global_batch) * m.seq_len;
  std::printf("== plan ==\n  model: %d layers, d_model %d, %d heads, seq_len %d, vocab %d, %s "
              "embeddings, %.2fM parameters, %.1f MFLOP/token\n",
              m.n_layer, m.d_model, m.n_head, m.seq_len, m.vocab_size,
              m.tie_embeddings ? "tied" : "untied", count_model_params(m) / 1e6,
              flops_per_token(m) / 1e6);
  std::printf("  batch: global %d sequences (%lld tokens) per step = dp %d x micro-batch %d x %d "
              "micro-batches; %d steps\n",
              cfg.train.global_batch, tokens, cfg.parallel.dp, cfg.train.micro_batch,
              cfg.accumulation(), cfg.train.steps);
  std::printf("  schedule: %s, pp %d, v %d, m %d; predicted bubble %.1f%% (T_F = 1, T_B = 2); "
              "peak live micro-batches per pp rank:",
              cfg.parallel.schedule.c_str(), cfg.parallel.pp, cfg.parallel.virtual_stages,
              cfg.parallel.micro_batches, 100.0 * plan.predicted.mean_bubble);
  for (int n : plan.peak_live) std::printf(" %d", n);
  std::printf("\n  backend: %s, precision %s, BLAS %s\n", cfg.device.kind.c_str(),
              cfg.device.precision.c_str(),
              cfg.device.kind == "cuda" ? "cublas (managed memory)" : ops::blas_name());
  std::fflush(stdout);
}

TrainResult train(const RunConfig& cfg, const Layout& layout, const Plan& plan) {
  const Backend& be = open_backend(cfg, layout.world());
  const bool root = layout.rank() == 0;
  const auto& m = cfg.model;
  const auto& t = cfg.train;
  const int threads = blas_threads_for(cfg.device, layout);
  ops::set_blas_threads(threads);
  const Watchdog watchdog(cfg.runtime.hang_timeout_s, layout.rank());

  auto data = open_collectively(layout.world(), cfg.data.path, m.vocab_size, m.seq_len);
  std::unique_ptr<TokenFile> val_data;
  if (!cfg.data.val_path.empty()) {
    val_data = open_collectively(layout.world(), cfg.data.val_path, m.vocab_size, m.seq_len);
  }
  std::optional<Error> log_err;
  std::unique_ptr<MetricsLog> log;
  try {
    log = std::make_unique<MetricsLog>(cfg.log.dir, root);
  } catch (const Error& e) {
    log_err = e;
  }
  agree(layout.world(), log_err);

  // this rank's chunks: virtual stages c*p + pp
  const int p = cfg.parallel.pp;
  const int v = cfg.parallel.virtual_stages;
  const int me = layout.coords().pp;
  std::string staged_why;
  const bool nccl =
      use_nccl("comm.gpu_collectives", cfg.comm.gpu_collectives, cfg, layout.world(), staged_why);
  std::unique_ptr<GroupReducer> tp_reduce; // shared by the chunks: they run one at a time
  if (layout.tp() > 1) {
    tp_reduce = make_reducer(layout.tp_comm(),
                             "the tensor-parallel all-reduce (tp group of "
                             "pipeline rank " +
                                 std::to_string(me) + ")",
                             watchdog, be,
                             nccl ? make_nccl(layout.tp_comm(), false, layout.world()) : nullptr);
  }
  std::vector<std::unique_ptr<GptStage>> chunks;
  std::vector<std::unique_ptr<AdamW>> opts;
  for (int c = 0; c < v; ++c) {
    const TpGroup tp{layout.coords().tp, layout.tp(), tp_reduce.get()};
    chunks.push_back(
        std::make_unique<GptStage>(m, stage_spec(plan.layers, c * p + me), t.micro_batch, tp, be));
    chunks.back()->init_parameters(t.seed);
    opts.push_back(std::make_unique<AdamW>(chunks.back()->layout(), t, be));
  }
  // every tensor of the model has one index, so the gradient norm is summed in one order in
  // every layout (bit-identical to the single-rank run)
  const ParamLayout whole(m, StageSpec{true, true, 0, m.n_layer});
  std::map<std::string, std::size_t> tensor_index;
  for (std::size_t i = 0; i < whole.tensors().size(); ++i) {
    tensor_index[whole.tensors()[i].name] = i;
  }
  std::vector<double> sq(whole.tensors().size());
  // per chunk, the tensors its gradient norm counts (shards on every tp rank, replicated tensors
  // on tp rank 0: each element once): their model index, offset and size, fixed for the run
  struct NormTensors {
    std::vector<std::size_t> index, offset, size;
    std::vector<double> sums;
  };
  std::vector<NormTensors> norm_tensors(chunks.size());
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    NormTensors& nt = norm_tensors[k];
    for (const auto& tensor : chunks[k]->layout().tensors()) {
      if (!chunks[k]->counts_in_norm(tensor)) continue;
      nt.index.push_back(tensor_index.at(tensor.name));
      nt.offset.push_back(tensor.offset);
      nt.size.push_back(tensor.size);
    }
    nt.sums.resize(nt.index.size());
  }

  const Sampler sampler(*data, m.seq_len, t.seed);
  // test switch: prove replicated gradients are bitwise equal on every tp rank, every step
  const bool check_tp_replicas = test_hooks().check_tp_replicas;
  int replicas_checked = 0;
  std::string p2p_why;
  const bool nccl_p2p =
      p > 1 && use_nccl("comm.gpu_p2p", cfg.comm.gpu_p2p, cfg, layout.world(), p2p_why);
  PipelineEngine engine(cfg, layout, plan.schedule, chunks, watchdog,
                        nccl_p2p ? make_nccl_links(plan.schedule, layout)
                                 : std::vector<std::unique_ptr<cuda::NcclLink>>{});
  const std::vector<std::unique_ptr<GradSync>> syncs =
      make_grad_syncs(cfg, layout, chunks, watchdog, nccl);
  {
    std::vector<GradSync*> raw;
    for (const auto& s : syncs) raw.push_back(s.get());
    engine.set_grad_sync(raw);
  }

  // MFU denominator: every rank's measured matrix-product rate (host sgemm, or cuBLAS at the
  // deck's precision), summed. Ranks sharing a GPU each count it: MFU is then understated.
  const bool gpu = cfg.device.kind == "cuda";
  double peak = gpu ? cuda::measure_gemm_flops(0.25) : measure_sgemm_flops(0.25);
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_SUM, layout.world()));
  if (root) {
    std::printf("== run ==\n  kernels %s; %d BLAS thread(s) per rank; measured %s peak %.1f "
                "GFLOP/s (all ranks); metrics -> %s\n",
                be.name, threads, gpu ? "cuBLAS 4096^3 GEMM" : "sgemm", peak / 1e9,
                log->path().c_str());
    if (!be.on_host() && (layout.dp() > 1 || layout.tp() > 1)) {
      std::printf("  GPU dp/tp reductions: %s\n",
                  nccl ? "NCCL on device memory"
                       : ("MPI on host copies (" + staged_why + ")").c_str());
    }
    if (!be.on_host() && p > 1) {
      std::printf("  GPU pipeline messages: %s\n",
                  nccl_p2p ? "NCCL send/receive on device memory"
                           : ("MPI on host copies (" + p2p_why + ")").c_str());
    }
    std::fflush(stdout);
  }

  const double tokens_per_step = static_cast<double>(t.global_batch) * m.seq_len;
  const double fpt = flops_per_token(m);
  const int micro = cfg.accumulation();

  TrainResult result;
  TrainState state;
  std::string from;
  Shards shards{chunks, opts};
  const double t_resume = MPI_Wtime();
  if (resume(cfg, layout, shards, state, from) && root) {
    std::printf("resumed from %s (read in %.2f s): %d of %d steps done\n", from.c_str(),
                MPI_Wtime() - t_resume, state.step, t.steps);
    std::fflush(stdout);
  }
  const int first_step = state.step;
  result.steps_done = first_step;
  int stop_seen = 0;
  auto save = [&](int steps_done, double lr) {
    state.step = steps_done;
    state.tokens_seen = static_cast<long long>(steps_done) * t.global_batch * m.seq_len;
    state.lr = lr;
    const double t0 = MPI_Wtime();
    const std::string path = write_checkpoint(cfg, layout, shards, plan.layers, state);
    if (root) {
      std::printf("checkpoint %s written in %.2f s\n", path.c_str(), MPI_Wtime() - t0);
      std::fflush(stdout);
    }
  };
  double time_sum = 0.0; // the steps after this run's first
  double first_dt = 0.0; // this run's first step
  reset_op_times();      // from here on: the partition's timing ran ops too
  double ema = 0.0;
  GradSyncStats comm_total;           // over this run's steps: max over ranks per step, summed
  std::vector<float> embedding_stage; // GPU backend: the tied-embedding gradient, host side
  for (int step = first_step; step < t.steps; ++step) {
    watchdog.barrier(layout.world(), "the barrier that starts step " + std::to_string(step + 1));
    const double t0 = MPI_Wtime();
    // log.op_profile counts the steps after the first (which also allocates scratch and has
    // cuBLAS choose its kernels), or the first alone in a one-step run
    if (step == first_step + 1) reset_op_times();
    for (auto& c : chunks) c->zero_grads();
    StepTimes times;
    double loss = engine.run(step, sampler, times);

    // gradients: tied head share, data-parallel sum, embedding group sum
    GradSyncStats comm;
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      chunks[c]->fold_tied_head_grad();
      if (!syncs.empty()) syncs[c]->finish(comm);
    }
    if (layout.embedding_comm() != MPI_COMM_NULL && m.tie_embeddings) {
      GptStage& edge = *chunks[me == 0 ? 0 : static_cast<std::size_t>(v - 1)];
      const ParamTensor& wte = edge.layout().at("wte");
      float* g = edge.grads() + wte.offset;
      if (!be.on_host()) embedding_stage.assign(g, g + wte.size); // MPI sees host memory only
      watchdog.allreduce(be.on_host() ? g : embedding_stage.data(), static_cast<int>(wte.size),
                         MPI_FLOAT, MPI_SUM, layout.embedding_comm(),
                         "the tied-embedding gradient all-reduce");
      if (!be.on_host()) std::copy(embedding_stage.begin(), embedding_stage.end(), g);
    }
    // loss: the last pipeline rank's sum over micro-batches, then over dp replicas
    if (layout.dp() > 1) {
      watchdog.allreduce(&loss, 1, MPI_DOUBLE, MPI_SUM, layout.dp_comm(), "the loss all-reduce");
    }
    watchdog.bcast(&loss, 1, MPI_DOUBLE, p - 1, layout.pp_comm(), "the loss broadcast");
    loss /= static_cast<double>(micro) * layout.dp();

    // global gradient norm: each tensor once, summed in model order; one backend call (one
    // wait on a GPU) per chunk
    std::fill(sq.begin(), sq.end(), 0.0);
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      NormTensors& nt = norm_tensors[k];
      be.sum_squares_each(nt.sums.data(), chunks[k]->grads(), nt.offset.data(), nt.size.data(),
                          static_cast<int>(nt.index.size()));
      for (std::size_t i = 0; i < nt.index.size(); ++i) sq[nt.index[i]] = nt.sums[i];
    }
    if (layout.tp() > 1) {
      watchdog.allreduce(sq.data(), static_cast<int>(sq.size()), MPI_DOUBLE, MPI_SUM,
                         layout.tp_comm(), "the gradient-norm all-reduce (tp)");
    }
    if (p > 1) {
      watchdog.allreduce(sq.data(), static_cast<int>(sq.size()), MPI_DOUBLE, MPI_SUM,
                         layout.pp_comm(), "the gradient-norm all-reduce");
    }
    if (check_tp_replicas) check_replicated_grads(chunks, layout, step, replicas_checked);
    double norm2 = 0.0;
    for (double x : sq) norm2 += x;
    const double norm = std::sqrt(norm2);
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      throw Error(ExitCode::non_finite,
                  "step " + std::to_string(step + 1) + ": loss = " + std::to_string(loss) +
                      ", grad norm = " + std::to_string(norm) +
                      " are not finite; nothing was updated.\n---> HINT: lower train.lr, raise "
                      "train.warmup_steps, or keep train.grad_clip > 0");
    }
    // torch.nn.utils.clip_grad_norm_ semantics
    float grad_scale = 1.0f;
    if (t.grad_clip > 0.0) {
      const double coef = t.grad_clip / (norm + 1e-6);
      if (coef < 1.0) grad_scale = static_cast<float>(coef);
    }
    const double lr = learning_rate(t, step);
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      opts[c]->step(chunks[c]->params(), chunks[c]->grads(), lr, grad_scale);
    }
    const double dt = MPI_Wtime() - t0;

    // bubble: measured idle / pipeline time (mean over pp ranks), and the simulator's
    // prediction from this step's measured per-rank action costs
    double bubble = 0.0, predicted = 0.0;
    if (p > 1) {
      double span = times.pipeline_s;
      double compute = times.compute_s;
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &span, 1, MPI_DOUBLE, MPI_MAX, layout.pp_comm()));
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &compute, 1, MPI_DOUBLE, MPI_SUM, layout.pp_comm()));
      bubble = 1.0 - compute / p / span;
      double mine[4];
      for (int k = 0; k < 4; ++k) mine[k] = times.op_n[k] ? times.op_s[k] / times.op_n[k] : 0.0;
      std::vector<double> all(static_cast<std::size_t>(4 * p));
      PT_MPI(MPI_Allgather(mine, 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, layout.pp_comm()));
      std::vector<schedule::Costs> costs;
      for (int r = 0; r < p; ++r) {
        const double* a = all.data() + 4 * r;
        costs.push_back(schedule::Costs{a[0], a[1], a[2], a[3], 0.0});
      }
      predicted = schedule::simulate(plan.schedule, costs).mean_bubble;
    }

    if (step > first_step) {
      time_sum += dt;
    } else {
      first_dt = dt;
    }
    ema = step == first_step ? dt : 0.9 * ema + 0.1 * dt;
    StepMetrics sm;
    sm.step = step + 1;
    sm.steps = t.steps;
    sm.loss = loss;
    sm.lr = lr;
    sm.grad_norm = norm;
    sm.step_time_s = dt;
    sm.tokens_per_s = tokens_per_step / dt;
    sm.tflops = fpt * tokens_per_step / dt / 1e12;
    sm.mfu = sm.tflops * 1e12 / peak;
    sm.bubble = bubble;
    sm.bubble_predicted = predicted;
    double comm_t[2] = {comm.exposed_s, comm.busy_s};
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, comm_t, 2, MPI_DOUBLE, MPI_MAX, layout.world()));
    sm.comm_exposed_s = comm_t[0];
    sm.comm_s = comm_t[1];
    comm_total.exposed_s += comm_t[0];
    comm_total.busy_s += comm_t[1];
    comm_total.buckets_early += comm.buckets_early;
    double mem = 0.0;
    for (auto& c : chunks) mem += static_cast<double>(c->bytes());
    for (auto& o : opts) mem += static_cast<double>(o->bytes());
    mem += static_cast<double>(engine.activation_bytes());
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &mem, 1, MPI_DOUBLE, MPI_MAX, layout.world()));
    sm.mem_bytes = mem;
    sm.eta_s = ema * (t.steps - step - 1);
    if (root) {
      const bool print = (step + 1) % cfg.log.every == 0 || step == 0 || step + 1 == t.steps;
      log->step(sm, print);
    }
    result.steps_done = step + 1;
    result.final_loss = loss;
    const bool val_now =
        (cfg.data.val_every > 0 && (step + 1) % cfg.data.val_every == 0) || step + 1 == t.steps;
    if (val_data && val_now) {
      const Sampler vs(*val_data, m.seq_len, t.seed ^ kValidationStream);
      const double val = engine.evaluate(vs, cfg.data.val_batches);
      if (root) log->validation(step + 1, val);
    }

    // checkpoints: every N steps, at the end, and when this run must stop early
    if (stop_seen == 0) stop_seen = poll_stop_signal();
    int stop = stop_seen;
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, layout.world()));
    const int run_steps = step + 1 - first_step;
    const bool stop_here = stop != 0 || (cfg.runtime.exit_after_steps > 0 &&
                                         run_steps == cfg.runtime.exit_after_steps);
    const bool periodic = cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0;
    if (cfg.checkpoint.enabled && (periodic || stop_here || step + 1 == t.steps)) {
      save(step + 1, lr);
    }
    if (stop_here && step + 1 < t.steps) {
      if (root) {
        std::printf("stopping after step %d (%s); %s\n", step + 1,
                    stop != 0 ? (stop == SIGTERM ? "SIGTERM" : "SIGUSR1")
                              : "runtime.exit_after_steps",
                    cfg.checkpoint.enabled ? "restart with checkpoint.resume = \"auto\" to continue"
                                           : "no [checkpoint] section: nothing was saved");
        std::fflush(stdout);
      }
      result.stopped_early = true;
      break;
    }
  }
  const int run_steps = result.steps_done - first_step;
  if (!syncs.empty() && run_steps > 0) {
    int early = comm_total.buckets_early;
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &early, 1, MPI_INT, MPI_MIN, layout.world()));
    if (root) {
      std::printf("dp gradient reduction (overlap %s): %.2f ms exposed of %.2f ms per step; "
                  "%d bucket(s) started during the backward\n",
                  syncs.front()->mode().c_str(), 1e3 * comm_total.exposed_s / run_steps,
                  1e3 * comm_total.busy_s / run_steps, early);
      std::fflush(stdout);
    }
    if (root && syncs.front()->reducer() != nullptr) { // auto's measured choices (rank 0's group)
      for (const auto& [n, ch] : syncs.front()->reducer()->measured()) {
        std::printf("dp all-reduce auto, %.1f KiB: %s (model: %s; measured", n * 4.0 / 1024.0,
                    algorithm_name(ch.pick), algorithm_name(ch.model));
        for (const auto& [algo, sec] : ch.seconds) {
          std::printf(" %s %.1f us", algorithm_name(algo), sec * 1e6);
        }
        std::printf(")\n");
      }
      std::fflush(stdout);
    }
  }
  const int timed = result.steps_done - first_step - 1;
  if (cfg.log.op_profile && timed >= 0) {
    print_op_profile(layout, timed > 0 ? timed : 1, timed > 0, timed > 0 ? time_sum : first_dt);
  }
  result.mean_tokens_per_s = timed > 0 ? tokens_per_step * timed / time_sum : 0.0;

  // Final parameters, per tensor in model order: an FNV-1a digest of the exact bytes (layouts
  // that must be bit-identical compare these), the sum of squares, and a random projection
  // sum_i p_i u_i (u_i in [-1, 1] from a hash), which any single changed element moves.
  const std::size_t G = whole.tensors().size();
  std::vector<double> sums(2 * G, 0.0);
  std::vector<unsigned long long> digests(G, 0);
  for (auto& c : chunks) {
    for (const auto& tensor : c->layout().tensors()) {
      if (!c->counts_in_norm(tensor)) continue;
      const std::size_t g = tensor_index.at(tensor.name);
      const float* w = c->params() + tensor.offset;
      unsigned long long h = 1469598103934665603ULL;
      const auto* bytes = reinterpret_cast<const unsigned char*>(w);
      for (std::size_t i = 0; i < tensor.size * sizeof(float); ++i)
        h = (h ^ bytes[i]) * 1099511628211ULL;
      // a shard's bytes are not the tensor's: digests are for layouts without tensor parallelism
      digests[g] = tensor.shard_dim < 0 ? h : 0;
      double s2 = 0.0, proj = 0.0;
      for (std::size_t i = 0; i < tensor.size; ++i) {
        s2 += static_cast<double>(w[i]) * w[i];
        proj += w[i] * (2.0 * unit_open0(hash3(7, g, c->layout().global_index(tensor, i))) - 1.0);
      }
      sums[2 * g] = s2;
      sums[2 * g + 1] = proj;
    }
  }
  for (MPI_Comm comm : {layout.tp_comm(), layout.pp_comm()}) {
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(2 * G), MPI_DOUBLE, MPI_SUM,
                         comm));
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, digests.data(), static_cast<int>(G), MPI_UNSIGNED_LONG_LONG,
                         MPI_SUM, comm));
  }
  if (check_tp_replicas && root) {
    std::printf("tp replica check: %d replicated gradient tensors were bitwise equal on all %d tp "
                "ranks at every step\n",
                replicas_checked, layout.tp());
  }
  if (root) {
    std::vector<ParamSummary> summary;
    for (std::size_t g = 0; g < G; ++g) {
      summary.push_back({whole.tensors()[g].name, digests[g], sums[2 * g], sums[2 * g + 1]});
    }
    log->final_params(summary);
  }
  return result;
}

} // namespace pt
