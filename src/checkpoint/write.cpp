// Writing a checkpoint: every tensor into its global dataset (each element by one rank), the
// metadata, then the atomic publish (docs/checkpoints.md).
#include "checkpoint/checkpoint.hpp"

#include <hdf5.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include <toml++/toml.h>

#include "checkpoint/datasets.hpp"
#include "checkpoint/hdf5_io.hpp"
#include "comm/watchdog.hpp"
#include "util/errors.hpp"
#include "util/hash.hpp"
#include "util/test_hooks.hpp"

namespace pt {
namespace {

using namespace ckpt;
namespace fs = std::filesystem;

// Test-only: while one lives, the process may write no byte to a file (a file-size limit of 0,
// RLIMIT_FSIZE): the kernel answers EFBIG (SIGXFSZ is ignored, main.cpp) as a full disk answers
// ENOSPC, and the failure comes back through MPI-IO and HDF5 like a real one.
class RefuseWrites {
public:
  explicit RefuseWrites(bool on) {
    if (!on || getrlimit(RLIMIT_FSIZE, &saved_) != 0) return;
    rlimit none = saved_;
    none.rlim_cur = 0;
    set_ = setrlimit(RLIMIT_FSIZE, &none) == 0;
  }
  ~RefuseWrites() {
    if (set_) setrlimit(RLIMIT_FSIZE, &saved_);
  }
  RefuseWrites(const RefuseWrites&) = delete;
  RefuseWrites& operator=(const RefuseWrites&) = delete;

private:
  rlimit saved_{};
  bool set_ = false;
};

// Creates every dataset of every section (collective, in one order on every rank): contiguous,
// never filled with fill values (every element is written); integrity comes from the
// per-dataset checksum attribute (docs/checkpoints.md explains the choice).
std::vector<H5> create_datasets(hid_t f, hid_t lcpl, const ParamLayout& whole, int nsec,
                                Watchdog::Scope& io, bool& ok) {
  std::vector<H5> sets;
  H5 dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  for (int sec = 0; sec < nsec; ++sec) {
    for (const ParamTensor& gt : whole.tensors()) {
      io.now("the checkpoint write's collective creation of dataset " + dataset_name(sec, gt));
      const std::vector<hsize_t> g = dims_of(gt);
      H5 space(H5Screate_simple(static_cast<int>(g.size()), g.data(), nullptr), H5Sclose);
      sets.emplace_back(H5Dcreate2(f, dataset_name(sec, gt).c_str(), H5T_IEEE_F32LE, space.get(),
                                   lcpl, dcpl.get(), H5P_DEFAULT),
                        H5Dclose);
      ok &= sets.back().ok();
    }
  }
  // The file's structure reaches the disk before its data: a disk that fills during the data
  // leaves the close only blocks it already holds to rewrite (a close whose flush is refused
  // waits forever inside HDF5's collective close, or crashes at MPI_Finalize with MPICH).
  io.now("the checkpoint write's collective flush of its structure");
  ok &= H5Fflush(f, H5F_SCOPE_LOCAL) >= 0;
  return sets;
}

// Creates every dataset, then writes this rank's slices of them (each element once, see
// writes(); independent MPI-IO, no rank waits for another) and then each dataset's checksum
// attribute: the slices' sums, added over all ranks. background: the thread's CPU priority drops
// to the lowest once the collective creations are done (an asynchronous save: the writes take
// the cycles training leaves). False on every rank where any rank failed (then no attribute is
// written: a full disk has no room for them).
bool write_tensors(hid_t f, hid_t lcpl, hid_t dxpl, const RunConfig& cfg, const Layout& layout,
                   MPI_Comm comm, const Watchdog& watchdog, Shards& shards, int step,
                   bool background) {
  bool ok = true;
  const ParamLayout whole = whole_layout(cfg.model);
  const std::size_t T = whole.tensors().size();
  const int nsec = shards.sections();
  // the slices' sums, then this rank's failures (added over all ranks with them)
  std::vector<unsigned long long> sums(static_cast<std::size_t>(nsec) * T + 1, 0);
  const std::vector<int> turns = dp_turns(whole, layout.dp());
  std::vector<float> staged; // a GPU backend's tensor, copied to host memory for MPI-IO
  Watchdog::Scope io(watchdog, "the checkpoint write's MPI-IO");
  std::vector<H5> sets = create_datasets(f, lcpl, whole, nsec, io, ok);
  // Linux: a thread's own nice value; failing leaves the normal priority, which is still correct
  if (background) setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
  // test-only (util/test_hooks.hpp): the kernel refuses the last rank's data writes, as on a
  // full disk (the attributes and the close that follow are allowed to write)
  std::optional<RefuseWrites> refuse(std::in_place, test_hooks().fail_in_checkpoint == step &&
                                                        layout.rank() == layout.size() - 1);
  for (int sec = 0; sec < nsec; ++sec) {
    // test-only (util/test_hooks.hpp): the last rank dies mid-write (fault test)
    if (sec == 1 && test_hooks().kill_in_checkpoint == step && layout.rank() == layout.size() - 1) {
      std::raise(SIGKILL);
    }
    for (std::size_t k = 0; k < T && ok; ++k) {
      const hid_t ds = sets[static_cast<std::size_t>(sec) * T + k].get();
      io.now("the checkpoint write's MPI-IO write of dataset " +
             dataset_name(sec, whole.tensors()[k]));
      for (const Local& l : locals(shards, whole.tensors()[k])) {
        if (!writes(l, sec, layout, turns, k)) continue;
        for (const Slice& piece : slices(l, sec)) {
          H5 fspace(H5Dget_space(ds), H5Sclose);
          select_slice(fspace.get(), l, piece, layout);
          hsize_t n = piece.size;
          H5 mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
          const float* buf = l.snapshot != nullptr
                                 ? piece.data // host memory
                                 : readable(l.stage->backend(), piece.data, piece.size, staged);
          sums[static_cast<std::size_t>(sec) * T + k] +=
              slice_checksum(l.stage->layout(), *l.t, buf, piece.begin, piece.size);
          ok &= H5Dwrite(ds, H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), dxpl, buf) >= 0;
        }
      }
    }
  }
  refuse.reset();
  sums.back() = ok ? 0 : 1;
  watchdog.allreduce(sums.data(), static_cast<int>(sums.size()), MPI_UNSIGNED_LONG_LONG, MPI_SUM,
                     comm, "the checkpoint's checksums (write)");
  if (sums.back() != 0) return false;
  io.now("the checkpoint write's collective checksum attributes");
  for (std::size_t i = 0; i < sets.size(); ++i) {
    ok &= write_attr(sets[i].get(), "checksum", H5T_NATIVE_ULLONG, &sums[i], 1);
  }
  return ok;
}

// The file's attributes, the resolved deck (/config, by rank 0), and the attributes of /optim,
// /data and /layout. False on a failure.
bool write_metadata(hid_t f, hid_t lcpl, hid_t dxpl, const RunConfig& cfg, const Layout& layout,
                    const Shards& shards, const std::vector<int>& partition,
                    const TrainState& state) {
  bool ok = true;
  const int schema = kCheckpointSchema;
  const long long step = state.step, tokens = state.tokens_seen;
  ok &= write_string_attr(f, "format", "pipetrain-checkpoint");
  ok &= write_attr(f, "schema_version", H5T_NATIVE_INT, &schema, 1);
  ok &= write_attr(f, "step", H5T_NATIVE_LLONG, &step, 1);
  ok &= write_attr(f, "tokens_seen", H5T_NATIVE_LLONG, &tokens, 1);
  // the activation format it was trained with (the parameters and moments are fp32 whatever it)
  ok &= write_string_attr(f, "precision", name(cfg.device.precision));
  ok &= write_string_attr(f, "arch", name(cfg.model.arch)); // the architecture (docs/models.md)
  {
    H5 type = string_type(cfg.resolved_text.size());
    H5 space(H5Screate(H5S_SCALAR), H5Sclose);
    H5 ds(H5Dcreate2(f, "/config", type.get(), space.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT),
          H5Dclose);
    H5 fsel(H5Screate(H5S_SCALAR), H5Sclose);
    if (layout.rank() != 0) H5Sselect_none(fsel.get());
    ok &= ds.ok() && H5Dwrite(ds.get(), type.get(), fsel.get(), fsel.get(), dxpl,
                              cfg.resolved_text.c_str()) >= 0;
  }
  H5 optim(H5Gopen2(f, "/optim", H5P_DEFAULT), H5Gclose);
  const int adam_step =
      shards.snapshot != nullptr ? shards.snapshot->updates : shards.opts.front()->updates();
  const double lr = state.lr, eps = cfg.train.eps, wd = cfg.train.weight_decay;
  const double betas[2] = {cfg.train.beta1, cfg.train.beta2};
  ok &= write_attr(optim.get(), "adam_step", H5T_NATIVE_INT, &adam_step, 1);
  ok &= write_attr(optim.get(), "lr", H5T_NATIVE_DOUBLE, &lr, 1);
  ok &= write_attr(optim.get(), "betas", H5T_NATIVE_DOUBLE, betas, 2);
  ok &= write_attr(optim.get(), "eps", H5T_NATIVE_DOUBLE, &eps, 1);
  ok &= write_attr(optim.get(), "wd", H5T_NATIVE_DOUBLE, &wd, 1);

  H5 data(H5Gcreate2(f, "/data", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  const unsigned long long seed = cfg.train.seed;
  ok &= write_attr(data.get(), "seed", H5T_NATIVE_ULLONG, &seed, 1);
  ok &= write_attr(data.get(), "cursor", H5T_NATIVE_LLONG, &step, 1); // sampler: (seed, step)

  H5 lay(H5Gcreate2(f, "/layout", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  const int dims[3] = {layout.pp(), layout.dp(), layout.tp()};
  ok &= write_attr(lay.get(), "pp", H5T_NATIVE_INT, &dims[0], 1);
  ok &= write_attr(lay.get(), "dp", H5T_NATIVE_INT, &dims[1], 1);
  ok &= write_attr(lay.get(), "tp", H5T_NATIVE_INT, &dims[2], 1);
  ok &= write_attr(lay.get(), "ep", H5T_NATIVE_INT, &cfg.parallel.ep, 1);
  ok &= write_attr(lay.get(), "virtual_stages", H5T_NATIVE_INT, &cfg.parallel.virtual_stages, 1);
  ok &= write_string_attr(lay.get(), "partition", name(cfg.parallel.partition));
  ok &= write_attr(lay.get(), "layers", H5T_NATIVE_INT, partition.data(),
                   static_cast<hsize_t>(partition.size()));
  return ok;
}

// Collective: whether `ok` holds on every rank of comm.
bool all_ok(const Watchdog& watchdog, MPI_Comm comm, bool ok, const std::string& what) {
  int all = ok ? 1 : 0;
  watchdog.allreduce(&all, 1, MPI_INT, MPI_MIN, comm, what);
  return all == 1;
}

// fsync: the data reaches the disk before a name points at it.
void sync_path(const std::string& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Rank 0: renames the written file to its final name, then points latest at it, then removes all
// but the newest `keep` checkpoints (never before the new one is in place, and never the new one:
// the directory may hold later steps of another run).
std::optional<Error> publish(const fs::path& dir, const std::string& partial,
                             const std::string& final_path, int step, int keep) {
  std::error_code ec;
  sync_path(partial);
  fs::rename(partial, final_path, ec);
  if (!ec) {
    const fs::path tmp = dir / "latest.tmp";
    std::ofstream(tmp) << step_file(step) << "\n";
    sync_path(tmp.string());
    fs::rename(tmp, dir / "latest", ec);
    sync_path(dir.string());
  }
  if (ec)
    return Error(ExitCode::other, "publishing checkpoint '" + final_path + "': " + ec.message());
  const std::vector<std::string> all = list_checkpoints(dir);
  const fs::path mine = fs::path(final_path).filename();
  for (std::size_t i = static_cast<std::size_t>(keep); i < all.size(); ++i) {
    if (fs::path(all[i]).filename() != mine) fs::remove(all[i], ec);
  }
  return std::nullopt;
}

// The sections of each chunk's tensors that this rank writes: bit sec of [chunk][tensor].
std::vector<std::vector<unsigned>> written_sections(const ModelConfig& model, const Layout& layout,
                                                    Shards shards) {
  const ParamLayout whole = whole_layout(model);
  const std::vector<int> turns = dp_turns(whole, layout.dp());
  std::vector<std::vector<unsigned>> out(shards.stages.size());
  for (std::size_t c = 0; c < out.size(); ++c) {
    out[c].assign(shards.stages[c]->layout().tensors().size(), 0);
  }
  for (std::size_t k = 0; k < whole.tensors().size(); ++k) {
    for (const Local& l : locals(shards, whole.tensors()[k])) {
      for (int sec = 0; sec < shards.sections(); ++sec) {
        if (writes(l, sec, layout, turns, k)) out[l.chunk][l.index] |= 1U << sec;
      }
    }
  }
  return out;
}

} // namespace

void take_snapshot(const ModelConfig& model, const Layout& layout, const Shards& shards,
                   Snapshot& s) {
  const std::size_t chunks = shards.stages.size();
  const std::vector<std::vector<unsigned>> mine = written_sections(model, layout, shards);
  s.params.resize(chunks);
  s.moments.resize(chunks);
  s.runs.assign(chunks, {});
  s.older.resize(shards.older != nullptr ? chunks : 0);
  s.updates = shards.opts.front()->updates();
  for (std::size_t c = 0; c < chunks; ++c) {
    GptStage& st = *shards.stages[c];
    const Backend& be = st.backend();
    const std::vector<ParamTensor>& tensors = st.layout().tensors();
    grow_scratch(s.params[c], st.num_params());
    if (shards.older != nullptr) grow_scratch(s.older[c], st.num_params());
    std::vector<std::vector<Optimizer::Run>> live(tensors.size());
    std::size_t floats = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      live[i] = shards.opts[c]->runs(i);
      for (const Optimizer::Run& r : live[i]) floats += 2 * r.size;
    }
    grow_scratch(s.moments[c], floats);
    float* at = s.moments[c].data();
    s.runs[c].resize(tensors.size());
    // every run has its place in the copy; only what this rank writes is copied into it (a
    // data-parallel replica writes its share of the tensors)
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const ParamTensor& t = tensors[i];
      const unsigned w = mine[c][i];
      if (w & 1U) to_host(be, s.params[c].data() + t.offset, st.params() + t.offset, t.size);
      if (w & 8U) {
        to_host(be, s.older[c].data() + t.offset, (*shards.older)[c].data() + t.offset, t.size);
      }
      for (const Optimizer::Run& r : live[i]) {
        if (w & 2U) to_host(be, at, r.m, r.size);
        if (w & 4U) to_host(be, at + r.size, r.v, r.size);
        s.runs[c][i].push_back({r.begin, r.size, at, at + r.size});
        at += 2 * r.size;
      }
    }
  }
}

std::string write_checkpoint(const RunConfig& cfg, const Layout& layout, const Watchdog& watchdog,
                             Shards shards, const std::vector<int>& partition,
                             const TrainState& state, MPI_Comm comm, bool background) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); // our messages, not HDF5's error stacks
  const bool root = layout.rank() == 0;
  const fs::path dir = cfg.checkpoint.dir;
  const std::string final_path = (dir / step_file(state.step)).string();
  const std::string partial = final_path + ".partial";
  std::optional<Error> err;
  if (root) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
      err = Error(ExitCode::other,
                  "checkpoint.dir '" + dir.string() + "' cannot be created: " + ec.message());
    }
  }
  watchdog.agree(comm, err, "the checkpoint write's agreement");
  bool ok = true;
  // test-only (util/test_hooks.hpp): the last rank stalls, the others wait in the collective open
  if (test_hooks().stall_in_checkpoint == state.step && layout.rank() == layout.size() - 1) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  {
    H5 file;
    {
      const Watchdog::Scope io(watchdog, "the collective MPI-IO open of '" + partial + "'");
      file = open_file(partial, comm, true);
    }
    if (!file.ok()) err = Error(ExitCode::other, "cannot create checkpoint '" + partial + "'");
    watchdog.agree(comm, err, "the checkpoint write's agreement");
    H5 lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    H5 dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT);
    const std::string what = "the checkpoint write's agreement";
    ok = all_ok(watchdog, comm,
                write_tensors(file.get(), lcpl.get(), dxpl.get(), cfg, layout, comm, watchdog,
                              shards, state.step, background),
                what);
    Watchdog::Scope io(watchdog, "the checkpoint write's collective metadata of '" + partial + "'");
    // agreed: after a failure no rank adds to the file what a full disk has no room for
    if (ok) {
      ok = all_ok(
          watchdog, comm,
          write_metadata(file.get(), lcpl.get(), dxpl.get(), cfg, layout, shards, partition, state),
          what);
    }
    io.now("the collective MPI-IO close (flush) of '" + partial + "'");
    if (!file.close()) ok = false;
  }
  if (!ok) {
    err = Error(ExitCode::other, "writing checkpoint '" + partial +
                                     "' failed; it is removed, and the checkpoints before it "
                                     "stand.\n---> HINT: is the disk full?");
  }
  try { // a failed write leaves no .partial file behind
    watchdog.agree(comm, err, "the checkpoint write's agreement");
  } catch (const Error&) {
    std::error_code ec;
    if (root) fs::remove(partial, ec);
    throw;
  }
  if (root) err = publish(dir, partial, final_path, state.step, cfg.checkpoint.keep);
  watchdog.agree(comm, err, "the checkpoint write's agreement");
  return final_path;
}

} // namespace pt
