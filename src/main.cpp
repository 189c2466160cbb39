// pipetrain: parse the deck, lay out the ranks, train. See README.md and docs/.
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/layout.hpp"
#include "comm/placement.hpp"
#include "config/deck_keys.hpp"
#include "config/load_deck.hpp"
#include "engine/trainer.hpp"
#include "model/schema.hpp"
#include "ops.hpp"
#include "plan/planner.hpp"
#include "schedule/cli.hpp"
#include "util/errors.hpp"

#ifndef PIPETRAIN_VERSION
#define PIPETRAIN_VERSION "unknown"
#endif

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// `pipetrain schema model.KEY=VALUE moe.KEY=VALUE ...`: the tensor table (model/schema.hpp) of
// that model as JSON, for tools/hf_format.py.
int schema(int argc, char** argv) {
  std::vector<std::string> model(argv + 2, argv + argc);
  for (const std::string& kv : model) {
    if (kv.rfind("model.", 0) != 0 && kv.rfind("moe.", 0) != 0) {
      std::fprintf(stderr,
                   "pipetrain: error: schema takes model.KEY=VALUE and moe.KEY=VALUE, not '%s'\n",
                   kv.c_str());
      return static_cast<int>(pt::ExitCode::bad_input);
    }
  }
  // the model's keys, in a deck whose other required keys are placeholders
  const std::string deck = "[train]\nsteps = 1\nglobal_batch = 1\nmicro_batch = 1\n"
                           "[data]\npath = \"-\"\n";
  try {
    const pt::RunConfig c = pt::parse_deck(deck, "schema", model, 1);
    std::fputs(pt::schema_json(c.model).c_str(), stdout);
    return 0;
  } catch (const pt::Error& e) {
    std::fprintf(stderr, "pipetrain: error: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}

// `pipetrain plan` (rank 0 runs it; one host thread). Returns the exit code, or -1 when argv
// names another command.
int subcommand(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "plan") return -1;
  if (world_rank() != 0) return 0;
  const pt::ops::HostThreads threads(1);
  return pt::plan_main(argc - 1, argv + 1);
}

// The subcommands that need no communicator, run without starting MPI (at once, and with no
// launcher): schedule, keys (the key reference of docs/deck.md), schema. Under a launcher only
// the first rank prints. Returns the exit code, or -1 when argv names none.
int offline_subcommand(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd != "schedule" && cmd != "keys" && cmd != "schema") return -1;
  for (const char* rank : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    const char* r = std::getenv(rank);
    if (r != nullptr && std::string(r) != "0") return 0;
  }
  try {
    const pt::ops::HostThreads threads(1);
    if (cmd == "schedule") return pt::schedule_main(argc - 1, argv + 1);
    if (cmd == "schema") return schema(argc, argv);
    std::fputs(pt::deck_keys_markdown().c_str(), stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipetrain: fatal: unexpected error: %s\n", e.what());
    return static_cast<int>(pt::ExitCode::other);
  }
}

// Every rank runs this; only rank 0 prints. Returns the process exit code.
int run(int argc, char** argv) {
  if (const int code = subcommand(argc, argv); code >= 0) return code;
  CLI::App app{"pipetrain: pipeline/data/tensor-parallel GPT training on MPI clusters.\n"
               "Usage: mpirun -np N pipetrain DECK.toml [section.key=value ...]"};
  app.footer("Every deck key: pipetrain keys (docs/deck.md). The planner: pipetrain plan --help. "
             "Schedules: pipetrain schedule --help. Tensors: pipetrain schema model.KEY=VALUE... "
             "Threads per rank: device.threads.");
  app.set_version_flag("--version", std::string("pipetrain ") + PIPETRAIN_VERSION);
  std::string deck;
  std::vector<std::string> overrides;
  bool validate_only = false;
  app.add_option("deck", deck, "input deck (TOML), e.g. inputs/tiny.toml");
  app.add_option("overrides", overrides, "section.key=value overrides, applied in order");
  app.add_flag("--validate", validate_only,
               "check the deck and layout for this rank count, print the plan, and exit");
  const bool root = world_rank() == 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (root) std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::CallForVersion&) {
    if (root) std::printf("pipetrain %s\n", PIPETRAIN_VERSION);
    return 0;
  } catch (const CLI::ParseError& e) {
    if (root) {
      std::fprintf(stderr, "pipetrain: error: %s\n---> HINT: run pipetrain --help\n", e.what());
    }
    return static_cast<int>(pt::ExitCode::bad_input);
  }
  if (deck.empty()) {
    if (root) {
      std::fprintf(stderr, "pipetrain: error: no input deck given\n---> HINT: pipetrain "
                           "inputs/tiny.toml (see pipetrain --help)\n");
    }
    return static_cast<int>(pt::ExitCode::bad_input);
  }

  try {
    pt::RunConfig cfg = pt::load_deck(MPI_COMM_WORLD, deck, overrides);
    const pt::Layout layout(MPI_COMM_WORLD, cfg.parallel, cfg.comm);
    // Kokkos starts once the threads of this rank are known (its OpenMP pool is fixed then)
    const pt::Placement placement =
        pt::place_threads(MPI_COMM_WORLD, cfg.device.threads, pt::ops::host_threads_available());
    cfg.device.threads = placement.threads;
    const pt::ops::HostThreads threads(placement.threads);
    const pt::Plan plan = pt::make_plan(cfg, layout, !validate_only);
    pt::print_plan(cfg, layout, placement, plan);
    pt::check_fit(cfg, layout, plan);
    if (validate_only) {
      if (root) std::printf("deck and layout are valid for %d rank(s)\n", layout.size());
      return 0;
    }
    const pt::TrainResult r = pt::train(cfg, layout, plan);
    if (root && !r.nothing_to_do) {
      std::printf("%s: %d steps, final loss %.4f, %.0f tokens/s (mean after the first step of this "
                  "run)\n",
                  r.stopped_early ? "stopped" : "done", r.steps_done, r.final_loss,
                  r.mean_tokens_per_s);
    }
    return 0;
  } catch (const pt::Error& e) {
    if (root) std::fprintf(stderr, "pipetrain: error: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}

} // namespace

int main(int argc, char** argv) {
  if (const int code = offline_subcommand(argc, argv); code >= 0) return code;
  // SIGTERM and SIGUSR1 are collected by the trainer between steps (graceful stop); blocked here,
  // before MPI and BLAS start threads, so every thread inherits the mask
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // a launcher may have started us with them ignored (to survive an early signal before this
  // point); ignored signals would be discarded, blocked ones stay pending for the trainer
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGUSR1, SIG_DFL);
  // a write past the file-size limit (ulimit -f) then fails with EFBIG and is reported like a
  // full disk (the checkpoint's .partial removed, exit 1) instead of killing the rank
  std::signal(SIGXFSZ, SIG_IGN);
  // comm.overlap = "thread" reduces gradients from a second thread
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const std::exception& e) {
    pt::fatal(std::string("unexpected error: ") + e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Finalize();
  return code;
}
