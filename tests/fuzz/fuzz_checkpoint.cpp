// libFuzzer target: HDF5 checkpoints through pt::read_checkpoint, on one MPI rank with the shards
// of a tiny model built as the trainer builds them (docs/fuzzing.md).
//
// Input: the bytes of an .h5 file (the seeds are real checkpoints of checkpoint_seed.toml's
// model, written by build/pipetrain: tests/fuzz/make_seeds.sh). Each input is written to a
// temporary file and loaded. A rejected file must raise pt::Error(checkpoint), the documented path;
// a sanitizer report, another exception, an abort or a hang is a finding. An accepted file must
// give a state the trainer can continue from: step and Adam's update count not negative. Either
// way no HDF5 handle may stay open. PT_FUZZ_VERBOSE=1 prints each verdict.
//
// Run as a singleton MPI job (no mpirun); as root, Open MPI wants OMPI_ALLOW_RUN_AS_ROOT=1 and
// OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the environment (tools/fuzz sets them).
#include <hdf5.h>
#include <mpi.h>
#include <sanitizer/lsan_interface.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "fuzz_common.hpp"
#include "host_memory.hpp"
#include "model/partition.hpp"
#include "optim/adamw.hpp"
#include "util/errors.hpp"

namespace {

// What a one-rank run holds when it resumes: config, layout, chunks and optimizers.
struct Rank {
  pt::RunConfig cfg;
  std::unique_ptr<pt::Layout> layout;
  std::vector<std::unique_ptr<pt::GptStage>> chunks;
  std::vector<std::unique_ptr<pt::AdamW>> opts;
  std::string path; // the temporary .h5 file each input is written to

  pt::Shards shards() const {
    pt::Shards s{{}, {}};
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      s.stages.push_back(chunks[c].get());
      s.opts.push_back(opts[c].get());
    }
    return s;
  }

  Rank() {
    // the deck the seeds were written with (make_seeds.sh), so an undamaged seed loads
    std::ifstream in(PT_FUZZ_CHECKPOINT_DECK);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) fuzz::finding("cannot read the seeds' deck", PT_FUZZ_CHECKPOINT_DECK);
    cfg = pt::parse_deck(text.str(), PT_FUZZ_CHECKPOINT_DECK, {}, 1);
    layout = std::make_unique<pt::Layout>(MPI_COMM_WORLD, cfg.parallel, cfg.comm);
    // as plan/plan.cpp partitions and engine/setup.cpp make_chunks builds them
    const int p = cfg.parallel.pp, me = layout->coords().pp;
    const std::vector<int> layers =
        pt::partition_layers(cfg.parallel, cfg.model.n_layer, p * cfg.parallel.virtual_stages,
                             pt::parameter_costs(cfg.model));
    for (int c = 0; c < cfg.parallel.virtual_stages; ++c) {
      chunks.push_back(std::make_unique<pt::GptStage>(
          cfg.model, pt::stage_spec(layers, c * p + me), cfg.train.micro_batch,
          pt::TpGroup{layout->coords().tp, layout->tp(), nullptr}, fuzz::kHostMemory));
      chunks.back()->init_parameters(cfg.train.seed);
      opts.push_back(
          std::make_unique<pt::AdamW>(chunks.back()->layout(), cfg.train, fuzz::kHostMemory));
    }
    path = fuzz::temp_path("checkpoint", ".h5");
  }
};

Rank* g_rank = nullptr;

// PT_FUZZ_KEEP=DIR keeps the last 4000 inputs there, numbered in the order they ran: a finding
// that needs an earlier input's effect on HDF5's state replays as
// `fuzz_checkpoint $(ls DIR/* | sort)`, one process over all of them.
void keep_input(const std::uint8_t* data, std::size_t size) {
  static const char* dir = std::getenv("PT_FUZZ_KEEP");
  static long n = 0;
  if (dir == nullptr) return;
  char name[32];
  std::snprintf(name, sizeof name, "/%010ld.h5", n);
  if (std::FILE* f = std::fopen((std::string(dir) + name).c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  std::snprintf(name, sizeof name, "/%010ld.h5", n - 4000);
  ::unlink((std::string(dir) + name).c_str());
  ++n;
}

// At exit: the temporary file goes. MPI is left initialized: MPI_Finalize unloads Open MPI's
// components, and LeakSanitizer would report what they still held as leaks of this program.
void finish() {
  if (g_rank != nullptr) ::unlink(g_rank->path.c_str());
  delete g_rank;
  g_rank = nullptr;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Open MPI's own handlers for SIGABRT/SIGSEGV/... would print and exit before libFuzzer saves
  // the input that crashed
  ::setenv("OMPI_MCA_opal_signal", "", 0);
  __lsan_disable(); // what Open MPI keeps from its start-up is not the loader's
  MPI_Init(nullptr, nullptr);
  __lsan_enable();
  g_rank = new Rank();
  std::atexit(finish);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Rank& r = *g_rank;
  fuzz::write_input(r.path, data, size);
  keep_input(data, size);
  try {
    const pt::TrainState st =
        pt::read_checkpoint(r.path, r.cfg, *r.layout, pt::Watchdog::none(), r.shards());
    if (fuzz::verbose()) std::fprintf(stderr, "loaded: step %d\n", st.step);
    if (st.step < 0) fuzz::finding("accepted a negative step", std::to_string(st.step));
    for (const auto& o : r.opts) {
      if (o->updates() < 0) {
        fuzz::finding("accepted a negative Adam update count", std::to_string(o->updates()));
      }
    }
  } catch (const pt::Error& e) {
    if (fuzz::verbose()) std::fprintf(stderr, "rejected: %s\n", e.what());
    if (e.code() != pt::ExitCode::checkpoint)
      fuzz::finding("pt::Error with a code other than 3", e.what());
  }
  // every handle the loader opened is closed again, whatever the verdict
  if (const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); open != 0) {
    fuzz::finding("HDF5 objects left open after the read", std::to_string(open));
  }
  return 0;
}
