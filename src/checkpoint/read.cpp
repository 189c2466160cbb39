// Reading a checkpoint: the header, the saved deck against this run's, every dataset's shape,
// this rank's slices, the checksums; and checkpoint.resume's choice of file.
#include "checkpoint/checkpoint.hpp"

#include <hdf5.h>

#include <fcntl.h>
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

#include <toml++/toml.h>

#include "checkpoint/datasets.hpp"
#include "checkpoint/hdf5_io.hpp"
#include "comm/watchdog.hpp"
#include "config/deck_keys.hpp"
#include "util/errors.hpp"
#include "util/hash.hpp"
#include "util/test_hooks.hpp"

namespace pt {
namespace {

using namespace ckpt;
namespace fs = std::filesystem;

Error ckpt_error(const std::string& path, const std::string& what) {
  return Error(ExitCode::checkpoint, "checkpoint '" + path + "': " + what);
}

// One step of reading a file's metadata, with the data segment allowed to grow by 1 GiB at most
// (DataGrowthLimit; a checkpoint's metadata takes a few MiB): on a damaged file on which HDF5
// would allocate without end, HDF5 or pipetrain's next allocation fails, and err says why.
template <class Step>
void metadata_step(const std::string& path, std::optional<Error>& err, Step&& step) {
  bool reached = false;
  try {
    const DataGrowthLimit limit(1ULL << 30);
    step();
    reached = limit.reached();
  } catch (const std::bad_alloc&) {
    reached = true;
  }
  if (reached) {
    H5garbage_collect(); // what HDF5 keeps on its free lists goes back to malloc
    err = ckpt_error(path, "reading its metadata took more than 1 GiB of memory: the file is "
                           "damaged");
  }
}

// The file's format, schema_version, step and tokens_seen, checked; an error names the problem.
std::optional<Error> read_header(hid_t f, const std::string& path, TrainState& st) {
  std::string format;
  int schema = 0;
  long long step = -1, tokens = 0;
  if (!read_string_attr(f, "format", format) || format != "pipetrain-checkpoint") {
    return ckpt_error(path, "is not a pipetrain checkpoint (attribute format is missing or wrong)");
  }
  if (!read_attr(f, "schema_version", H5T_NATIVE_INT, schema) || schema != kCheckpointSchema) {
    return ckpt_error(path, "schema_version " + std::to_string(schema) + ", this pipetrain reads " +
                                std::to_string(kCheckpointSchema));
  }
  if (!read_attr(f, "step", H5T_NATIVE_LLONG, step) ||
      !read_attr(f, "tokens_seen", H5T_NATIVE_LLONG, tokens)) {
    return ckpt_error(path, "the step or tokens_seen attribute is missing");
  }
  // a damaged count would resume at a step that does not exist (a negative step's learning rate
  // is NaN)
  if (step < 0 || step > std::numeric_limits<int>::max() || tokens < 0) {
    return ckpt_error(path, "step = " + std::to_string(step) +
                                ", tokens_seen = " + std::to_string(tokens) +
                                " is not a count of steps and tokens: the file is damaged");
  }
  st.step = static_cast<int>(step);
  st.tokens_seen = tokens;
  return std::nullopt;
}

std::string shape_text(const std::vector<hsize_t>& v) {
  std::string s = "(";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ")";
}

// Opens every dataset, checking its shape and type against the deck's model before any data is
// read; sets err (and stops) at the first that does not fit.
std::vector<H5> open_datasets(hid_t f, const ParamLayout& whole, int nsec, const std::string& path,
                              std::optional<Error>& err) {
  std::vector<H5> sets;
  for (int sec = 0; sec < nsec; ++sec) {
    for (const ParamTensor& gt : whole.tensors()) {
      const std::string name = dataset_name(sec, gt);
      if (sec == 3 && H5Lexists(f, "/model_prev", H5P_DEFAULT) <= 0) {
        err = ckpt_error(path, "it has no /model_prev, the older weights a schedule = \"2bw\" "
                               "run continues from: it was written by another schedule; resume "
                               "it with that schedule, or start afresh (checkpoint.resume = "
                               "\"none\")");
        return sets;
      }
      H5 ds(H5Dopen2(f, name.c_str(), H5P_DEFAULT), H5Dclose);
      if (!ds.ok()) {
        err = ckpt_error(path, "dataset " + name + " is missing");
        return sets;
      }
      H5 space(H5Dget_space(ds.get()), H5Sclose);
      const std::vector<hsize_t> want = dims_of(gt);
      std::vector<hsize_t> have(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space.get())));
      H5Sget_simple_extent_dims(space.get(), have.data(), nullptr);
      H5 type(H5Dget_type(ds.get()), H5Tclose);
      if (have != want) {
        err = ckpt_error(path, "dataset " + name + " has shape " + shape_text(have) +
                                   " but the deck's model needs " + shape_text(want) +
                                   ": the checkpoint is of another model");
        return sets;
      }
      if (H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4) {
        err = ckpt_error(path, "dataset " + name + " is not float32");
        return sets;
      }
      sets.push_back(std::move(ds));
    }
  }
  return sets;
}

// One slice of a copy from the dataset ds into its memory. Returns the host memory it was read
// into (the slice, or on a GPU the staging copy), null on an error.
const float* read_slice(hid_t ds, const Local& l, const Slice& piece, const Layout& layout,
                        std::vector<float>& staged, const std::string& name,
                        const std::string& path, std::optional<Error>& err) {
  H5 fspace(H5Dget_space(ds), H5Sclose);
  select_slice(fspace.get(), l, piece, layout);
  hsize_t n = piece.size;
  H5 mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
  // a GPU backend's tensor is read into host memory first (MPI-IO sees host memory only)
  const bool on_host = l.stage->backend().on_host();
  if (!on_host) staged.resize(piece.size);
  float* dst = on_host ? piece.data : staged.data();
  if (H5Dread(ds, H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, dst) < 0) {
    err = ckpt_error(path, "dataset " + name + " cannot be read: the file is truncated or damaged");
    return nullptr;
  }
  if (!on_host) from_host(l.stage->backend(), piece.data, staged.data(), staged.size());
  return dst;
}

// Every rank reads its slices (all replicas, every copy) into the shards, and adds the checksums
// of those it verifies (each element once, see writes()) to got [section * tensors + tensor]
// while each slice is still in the cache: one pass over the data.
void read_tensors(const std::vector<H5>& sets, const ParamLayout& whole, const Layout& layout,
                  Shards& shards, const std::string& path, std::optional<Error>& err,
                  std::vector<unsigned long long>& got) {
  const std::vector<int> turns = dp_turns(whole, layout.dp());
  std::size_t i = 0;
  std::vector<float> staged;
  for (int sec = 0; sec < shards.sections(); ++sec) {
    for (std::size_t k = 0; k < whole.tensors().size(); ++k, ++i) {
      const ParamTensor& gt = whole.tensors()[k];
      for (const Local& l : locals(shards, gt)) {
        const bool verifies = writes(l, sec, layout, turns, k);
        for (const Slice& piece : slices(l, sec)) {
          if (err) return;
          const float* x =
              read_slice(sets[i].get(), l, piece, layout, staged, dataset_name(sec, gt), path, err);
          if (x != nullptr && verifies) {
            got[i] += slice_checksum(l.stage->layout(), *l.t, x, piece.begin, piece.size);
          }
        }
      }
    }
  }
}

// The read slices' checksums (got, from read_tensors), added over all ranks, against each
// dataset's checksum attribute. Collective even when err is already set.
void verify_checksums(const std::vector<H5>& sets, const ParamLayout& whole, const Layout& layout,
                      const Watchdog& watchdog, std::vector<unsigned long long>& got,
                      const std::string& path, std::optional<Error>& err) {
  const std::size_t T = whole.tensors().size();
  std::vector<unsigned long long> want(got.size(), 0);
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!read_attr(sets[i].get(), "checksum", H5T_NATIVE_ULLONG, want[i]) && !err) {
      err = ckpt_error(path, "dataset " +
                                 dataset_name(static_cast<int>(i / T), whole.tensors()[i % T]) +
                                 " has no checksum attribute");
    }
  }
  watchdog.allreduce(got.data(), static_cast<int>(got.size()), MPI_UNSIGNED_LONG_LONG, MPI_SUM,
                     layout.world(), "the checkpoint's checksums (read)");
  for (std::size_t i = 0; i < got.size() && !err; ++i) {
    if (got[i] != want[i]) {
      err = ckpt_error(path, "dataset " +
                                 dataset_name(static_cast<int>(i / T), whole.tensors()[i % T]) +
                                 " fails its checksum: the data is damaged");
    }
  }
}

// A checkpoint of another model: resume = "auto" stops at it rather than falling back to older
// checkpoints (they are in the same directory, so most likely of that model too).
struct ForeignCheckpoint : Error {
  explicit ForeignCheckpoint(const Error& e) : Error(e) {}
};

ForeignCheckpoint another_model(const std::string& path, const std::string& key,
                                const std::string& saved, const std::string& deck) {
  return ForeignCheckpoint(
      ckpt_error(path, std::string("is of another model: ") +
                           (key.find('.') == std::string::npos ? "model." : "") + key + " = " +
                           saved + " in the checkpoint, " + deck +
                           " in the deck.\n---> HINT: give each run its own checkpoint.dir, or set "
                           "checkpoint.resume = \"none\" to start afresh"));
}

// The resolved deck the checkpoint was written with (/config).
std::optional<Error> read_config(hid_t f, const std::string& path, std::string& text) {
  H5 ds(H5Dopen2(f, "/config", H5P_DEFAULT), H5Dclose);
  H5 type(ds.ok() ? H5Dget_type(ds.get()) : -1, H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_STRING) {
    return ckpt_error(path, "has no /config (the deck it was written with)");
  }
  H5 space(H5Dget_space(ds.get()), H5Sclose);
  // a resolved deck is a few kB; 16 MiB bounds what a damaged size could allocate
  if (!read_string(ds.get(), space.get(), type.get(), std::size_t{16} << 20, false, text)) {
    return ckpt_error(path, "its /config cannot be read: the file is truncated or damaged");
  }
  return std::nullopt;
}

// The saved deck against this run's: a model key that differs makes the checkpoint another
// model's (docs/design.md section 8: shapes alone do not show n_head). A changed data path, seed or
// global batch is allowed, with a warning on rank 0.
void compare_config(const std::string& saved, const RunConfig& cfg, const std::string& path,
                    bool root) {
  RunConfig old;
  try {
    const toml::table t = toml::parse(saved);
    // the job that wrote it: pp * dp * tp ranks (dp is stored resolved, so each is >= 1); a
    // damaged count must not become a job of 0 ranks or overflow
    long long ranks = 1;
    for (const char* key : {"pp", "dp", "tp"}) {
      const std::int64_t n = t["parallel"][key].value_or(std::int64_t{1});
      if (n < 1 || n > std::numeric_limits<int>::max() / ranks) {
        throw input_error("parallel." + std::string(key) + " = " + std::to_string(n) +
                          " is not the rank count of a job");
      }
      ranks *= n;
    }
    old = parse_deck(saved, path + ":/config", {}, static_cast<int>(ranks));
  } catch (const std::exception& e) {
    throw ForeignCheckpoint(ckpt_error(path, std::string("its /config is not a deck this pipetrain "
                                                         "reads: ") +
                                                 e.what()));
  }
  // every [model] key of the deck table, so a key added there is compared here too
  const auto was = model_description(old.model), is = model_description(cfg.model);
  for (std::size_t i = 0; i < was.size(); ++i) {
    if (was[i].second != is[i].second) {
      throw another_model(path, was[i].first, was[i].second, is[i].second);
    }
  }
  if (!root) return;
  const std::pair<const char*, std::pair<std::string, std::string>> run_keys[] = {
      {"data.path", {old.data.path, cfg.data.path}},
      {"train.seed", {std::to_string(old.train.seed), std::to_string(cfg.train.seed)}},
      {"train.global_batch",
       {std::to_string(old.train.global_batch), std::to_string(cfg.train.global_batch)}},
      {"device.precision", {name(old.device.precision), name(cfg.device.precision)}}};
  for (const auto& [key, v] : run_keys) {
    if (v.first == v.second) continue;
    std::fprintf(stderr,
                 "pipetrain: warning: resuming '%s', written with %s = %s; this run has %s: the "
                 "steps after the checkpoint differ from an uninterrupted run\n",
                 path.c_str(), key, v.first.c_str(), v.second.c_str());
  }
  std::fflush(stderr);
}

} // namespace

TrainState read_checkpoint(const std::string& path, const RunConfig& cfg, const Layout& layout,
                           const Watchdog& watchdog, Shards shards) {
  // HDF5 1.10.8 can read memory it freed when it opens a file after failing on damaged ones in
  // the same process (docs/fuzzing.md), as resume = "auto" does when it falls back to older
  // checkpoints. Every read therefore ends, on every path out, with H5close: the library's state
  // is dropped (pipetrain holds no HDF5 handle between calls) and the next call starts afresh.
  struct CloseLibrary {
    ~CloseLibrary() { H5close(); }
  } close_library_after_read;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::optional<Error> err;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) err = ckpt_error(path, "no such file");
  watchdog.agree(layout.world(), err, "the checkpoint read's agreement");
  // HDF5 parses the file's metadata in four steps, each under a memory bound, each agreed on
  const auto parse = [&](auto&& step) {
    metadata_step(path, err, step);
    watchdog.agree(layout.world(), err, "the checkpoint read's agreement");
  };
  H5 file;
  parse([&] {
    const Watchdog::Scope io(watchdog, "the collective MPI-IO open of '" + path + "'");
    file = open_file(path, layout.world(), false);
    if (!file.ok()) {
      err =
          ckpt_error(path, "cannot be opened as HDF5: truncated or damaged (or not a checkpoint)");
    }
  });
  TrainState st;
  parse([&] { err = read_header(file.get(), path, st); });
  // the architecture first: another one's tensors differ in name and shape (absent: a file
  // written before llama, gpt2's)
  std::string arch = name(Arch::gpt2);
  parse([&] { read_string_attr(file.get(), "arch", arch); });
  if (arch != name(cfg.model.arch)) throw another_model(path, "arch", arch, name(cfg.model.arch));
  // then the model's keys (a model of other shapes is named by its key, not by a dataset)
  std::string saved;
  parse([&] { err = read_config(file.get(), path, saved); });
  compare_config(saved, cfg, path, layout.rank() == 0); // the same verdict on every rank
  const ParamLayout whole = whole_layout(cfg.model);
  std::vector<H5> sets;
  parse([&] { sets = open_datasets(file.get(), whole, shards.sections(), path, err); });
  std::vector<unsigned long long> got(sets.size(), 0);
  read_tensors(sets, whole, layout, shards, path, err, got);
  verify_checksums(sets, whole, layout, watchdog, got, path, err);
  int adam_step = 0;
  {
    H5 optim(H5Gopen2(file.get(), "/optim", H5P_DEFAULT), H5Gclose);
    if (!err && (!optim.ok() || !read_attr(optim.get(), "adam_step", H5T_NATIVE_INT, adam_step) ||
                 !read_attr(optim.get(), "lr", H5T_NATIVE_DOUBLE, st.lr))) {
      err = ckpt_error(path, "the /optim attributes adam_step and lr are missing");
    }
    if (!err && adam_step < 0) { // the next update's bias correction 1 - beta^t needs t >= 1
      err = ckpt_error(path, "the /optim attribute adam_step = " + std::to_string(adam_step) +
                                 " is negative: the file is damaged");
    }
  }
  sets.clear();
  {
    const Watchdog::Scope io(watchdog, "the collective MPI-IO close of '" + path + "'");
    file.reset();
  }
  watchdog.agree(layout.world(), err, "the checkpoint read's agreement");
  for (auto& o : shards.opts) o->set_updates(adam_step);
  return st;
}

bool resume(const RunConfig& cfg, const Layout& layout, const Watchdog& watchdog, Shards shards,
            TrainState& state, std::string& from) {
  if (!cfg.checkpoint.enabled || cfg.checkpoint.resume == "none") return false;
  if (cfg.checkpoint.resume != "auto") {
    state = read_checkpoint(cfg.checkpoint.resume, cfg, layout, watchdog, shards);
    from = cfg.checkpoint.resume;
    return true;
  }
  // auto: what latest names first, then every published checkpoint, newest first
  std::string list;
  if (layout.rank() == 0) {
    const fs::path dir = cfg.checkpoint.dir;
    std::vector<std::string> cands;
    std::ifstream latest(dir / "latest");
    std::string name;
    if (latest >> name) cands.push_back((dir / name).string());
    for (const std::string& c : list_checkpoints(dir)) {
      if (std::find(cands.begin(), cands.end(), c) == cands.end()) cands.push_back(c);
    }
    for (const std::string& c : cands) list += c + "\n";
  }
  watchdog.broadcast_text(list, 0, layout.world(), "the list of checkpoints to resume from");
  std::istringstream in(list);
  std::string cand;
  int tried = 0;
  while (std::getline(in, cand)) {
    ++tried;
    try {
      state = read_checkpoint(cand, cfg, layout, watchdog, shards);
      from = cand;
      return true;
    } catch (const ForeignCheckpoint&) {
      throw;
    } catch (const Error& e) {
      if (e.code() != ExitCode::checkpoint) throw;
      if (layout.rank() == 0) {
        std::fprintf(stderr, "pipetrain: warning: %s; trying an older checkpoint\n", e.what());
        std::fflush(stderr);
      }
    }
  }
  if (tried == 0) return false;
  throw Error(ExitCode::checkpoint,
              "checkpoint.resume = \"auto\": none of the " + std::to_string(tried) +
                  " checkpoints in '" + cfg.checkpoint.dir +
                  "' is usable (see the warnings above): move them away, or set "
                  "checkpoint.resume = \"none\" to start afresh");
}

} // namespace pt
