// Deck parsing and validation. Every error names where the value came from (file:line or the
// command-line override), the key, what was found, and what to change.
#include "config/run_config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "util/errors.hpp"

namespace pt {
namespace {

// The keys each section accepts (DESIGN.md section 4 plus the documented extras).
const std::map<std::string, std::vector<std::string>>& known_keys() {
  static const std::map<std::string, std::vector<std::string>> keys = {
      {"model", {"n_layer", "n_head", "d_model", "seq_len", "vocab_size", "tie_embeddings"}},
      {"parallel",
       {"pp", "dp", "tp", "virtual_stages", "schedule", "micro_batches", "partition",
        "allow_tp_across_nodes", "zero", "sequence_parallel"}},
      {"train",
       {"steps", "global_batch", "micro_batch", "lr", "min_lr", "warmup_steps", "weight_decay",
        "grad_clip", "beta1", "beta2", "eps", "seed", "recompute"}},
      {"data", {"path", "val_path", "val_every", "val_batches"}},
      {"checkpoint", {"dir", "every", "keep", "resume"}},
      {"comm",
       {"allreduce", "autotune", "topology", "calibration", "bucket_mb", "overlap",
        "ranks_per_node", "gpu_collectives", "gpu_p2p"}},
      {"device", {"kind", "precision", "blas_threads"}},
      {"log", {"every", "dir", "trace", "trace_steps", "op_profile"}},
      {"runtime", {"hang_timeout_s", "deterministic", "exit_after_steps"}},
  };
  return keys;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string suggestion(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = 3; // only suggest close matches
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(name, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best.empty() ? std::string() : "; did you mean '" + best + "'?";
}

std::string describe(const toml::node& n) {
  std::ostringstream os;
  if (n.is_string()) {
    os << '"' << n.value<std::string>().value_or("") << '"';
  } else if (n.is_array()) {
    os << *n.as_array();
  } else if (n.is_table()) {
    os << "a table";
  } else if (n.is_integer()) {
    os << n.value<std::int64_t>().value_or(0);
  } else if (n.is_floating_point()) {
    os << n.value<double>().value_or(0.0);
  } else if (n.is_boolean()) {
    os << (n.value<bool>().value_or(false) ? "true" : "false");
  } else {
    os << "a value";
  }
  return os.str();
}

// Reads typed values out of the parsed deck, remembering which keys were used and filling in
// defaults so the resolved deck can be printed and stored.
class DeckReader {
public:
  DeckReader(toml::table& root, std::string path, std::set<std::string> overridden)
      : root_(root), path_(std::move(path)), overridden_(std::move(overridden)) {}

  std::string where(const std::string& sec, const std::string& key) const {
    const std::string full = sec + "." + key;
    if (overridden_.count(full)) return "command-line override " + full;
    if (const toml::node* n = find(sec, key)) {
      return path_ + ":" + std::to_string(n->source().begin.line) + ": " + full;
    }
    return path_ + ": " + full;
  }

  [[noreturn]] void fail(const std::string& sec, const std::string& key,
                         const std::string& what) const {
    throw input_error(where(sec, key) + " " + what);
  }

  std::int64_t get_int(const std::string& sec, const std::string& key,
                       std::optional<std::int64_t> def, std::int64_t lo, std::int64_t hi) {
    const toml::node* n = use(sec, key);
    if (n == nullptr) {
      if (!def)
        missing(sec, key, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      set_default(sec, key, toml::value<std::int64_t>(*def));
      return *def;
    }
    if (!n->is_integer()) {
      fail(sec, key,
           "= " + describe(*n) + " must be an integer (for example " +
               std::to_string(std::max<std::int64_t>(lo, 1)) + ")");
    }
    const std::int64_t v = *n->value<std::int64_t>();
    if (v < lo || v > hi) {
      fail(sec, key,
           "= " + std::to_string(v) + " is out of range: expected an integer in [" +
               std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return v;
  }

  double get_double(const std::string& sec, const std::string& key, std::optional<double> def,
                    double lo, double hi, bool lo_open = false) {
    const toml::node* n = use(sec, key);
    if (n == nullptr) {
      if (!def) missing(sec, key, "a number");
      set_default(sec, key, toml::value<double>(*def));
      return *def;
    }
    double v = 0.0;
    if (n->is_floating_point()) {
      v = *n->value<double>();
    } else if (n->is_integer()) {
      v = static_cast<double>(*n->value<std::int64_t>());
    } else {
      fail(sec, key, "= " + describe(*n) + " must be a number (for example 0.001)");
    }
    const bool below = lo_open ? !(v > lo) : !(v >= lo);
    if (!std::isfinite(v) || below || v > hi) {
      std::ostringstream os;
      os << "= " << v << " is out of range: expected a number in " << (lo_open ? "(" : "[") << lo
         << ", " << hi << "]";
      fail(sec, key, os.str());
    }
    return v;
  }

  bool get_bool(const std::string& sec, const std::string& key, bool def) {
    const toml::node* n = use(sec, key);
    if (n == nullptr) {
      set_default(sec, key, toml::value<bool>(def));
      return def;
    }
    if (!n->is_boolean()) fail(sec, key, "= " + describe(*n) + " must be true or false");
    return *n->value<bool>();
  }

  std::string get_string(const std::string& sec, const std::string& key,
                         std::optional<std::string> def,
                         const std::vector<std::string>& allowed = {}) {
    const toml::node* n = use(sec, key);
    if (n == nullptr) {
      if (!def) missing(sec, key, "a string");
      set_default(sec, key, toml::value<std::string>(*def));
      return *def;
    }
    if (!n->is_string()) fail(sec, key, "= " + describe(*n) + " must be a string in quotes");
    const std::string v = *n->value<std::string>();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : "|") + a;
      fail(sec, key, "= \"" + v + "\" is not one of " + list + suggestion(v, allowed));
    }
    return v;
  }

  // A string key naming one of `values` (spelled as name() gives them), as its enum.
  template <class E>
  E get_enum(const std::string& sec, const std::string& key, E def,
             std::initializer_list<E> values) {
    std::vector<std::string> allowed;
    for (E v : values) allowed.push_back(name(v));
    const std::string s = get_string(sec, key, std::string(name(def)), allowed);
    for (E v : values) {
      if (s == name(v)) return v;
    }
    return def; // not reached: get_string accepts only `allowed`
  }

  const toml::node* raw(const std::string& sec, const std::string& key) { return use(sec, key); }

  // Unknown sections and keys are errors, with the nearest known name as a hint.
  void reject_unknown() const {
    std::vector<std::string> sections;
    for (const auto& [s, keys] : known_keys()) sections.push_back(s);
    for (auto&& [sk, snode] : root_) {
      const std::string sec(sk.str());
      auto it = known_keys().find(sec);
      if (it == known_keys().end()) {
        throw input_error(path_ + ":" + std::to_string(snode.source().begin.line) +
                          ": unknown section [" + sec + "]" + suggestion(sec, sections) +
                          " (sections: model parallel train data checkpoint comm device log "
                          "runtime)");
      }
      if (!snode.is_table()) {
        throw input_error(path_ + ":" + std::to_string(snode.source().begin.line) + ": '" + sec +
                          "' must be a [" + sec + "] section, not a value");
      }
      for (auto&& [k, node] : *snode.as_table()) {
        const std::string key(k.str());
        if (std::find(it->second.begin(), it->second.end(), key) == it->second.end()) {
          throw input_error(where(sec, key) + " is not a known key of [" + sec + "]" +
                            suggestion(key, it->second) + " (see docs/deck.md)");
        }
      }
    }
  }

private:
  const toml::node* find(const std::string& sec, const std::string& key) const {
    const toml::node* s = root_.get(sec);
    if (s == nullptr || !s->is_table()) return nullptr;
    return s->as_table()->get(key);
  }
  const toml::node* use(const std::string& sec, const std::string& key) { return find(sec, key); }
  [[noreturn]] void missing(const std::string& sec, const std::string& key,
                            const std::string& expected) const {
    throw input_error(path_ + ": missing required key " + sec + "." + key + " (" + expected +
                      "): add it under [" + sec + "] or pass " + sec + "." + key +
                      "=VALUE on the command line");
  }
  template <class V> void set_default(const std::string& sec, const std::string& key, V&& v) {
    toml::node* s = root_.get(sec);
    if (s == nullptr) {
      root_.insert(sec, toml::table{});
      s = root_.get(sec);
    }
    if (s->is_table()) s->as_table()->insert(key, std::forward<V>(v));
  }

  toml::table& root_;
  std::string path_;
  std::set<std::string> overridden_;
};

// Whether s is well-formed UTF-8: no stray continuation byte, no overlong form, no surrogate,
// nothing past U+10FFFF.
bool is_utf8(const std::string& s) {
  static constexpr std::uint32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000}; // by sequence length
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t len = c < 0x80           ? 1
                            : (c >> 5) == 0x6  ? 2
                            : (c >> 4) == 0xE  ? 3
                            : (c >> 3) == 0x1E ? 4
                                               : 0;
    if (len == 0 || i + len > s.size()) return false;
    std::uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
    for (std::size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if (cp < kLeast[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// "section.key=value" -> (section, key, parsed value). A value that is not valid TOML is taken as
// a bare string, so data.path=data/x.bin needs no quotes.
void apply_override(toml::table& root, const std::string& arg, std::set<std::string>& overridden) {
  const auto eq = arg.find('=');
  const std::string name = arg.substr(0, eq);
  const auto dot = name.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == name.size() ||
      name.find('.', dot + 1) != std::string::npos) {
    throw input_error("command-line argument '" + arg +
                      "' is not an override: expected section.key=value, for example "
                      "train.steps=200");
  }
  const std::string sec = name.substr(0, dot);
  const std::string key = name.substr(dot + 1);
  const std::string text = arg.substr(eq + 1);
  if (text.empty()) {
    throw input_error("command-line override " + name + " has no value: expected " + name +
                      "=VALUE");
  }

  toml::table parsed;
  bool is_toml = true;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    is_toml = false;
  }
  toml::node* s = root.get(sec);
  if (s == nullptr) {
    root.insert(sec, toml::table{});
    s = root.get(sec);
  }
  if (!s->is_table()) {
    throw input_error("command-line override " + name + ": '" + sec + "' is not a section");
  }
  if (is_toml && parsed.get("v") != nullptr) {
    parsed.get("v")->visit([&](auto&& v) { s->as_table()->insert_or_assign(key, v); });
  } else {
    if (!is_utf8(text)) {
      throw input_error("command-line override " + name +
                        " = a value that is not UTF-8 text: a deck is UTF-8 (TOML), so the "
                        "resolved deck pipetrain prints and saves could not hold it; give a UTF-8 "
                        "value (for a path: rename the file)");
    }
    s->as_table()->insert_or_assign(key, text);
  }
  overridden.insert(name);
}

} // namespace

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

  DeckReader r(root, deck_path, overridden);
  r.reject_unknown();

  RunConfig c;
  c.deck_path = deck_path;
  constexpr std::int64_t kBig = 1 << 30;

  // [model]
  c.model.n_layer = static_cast<int>(r.get_int("model", "n_layer", {}, 1, 4096));
  c.model.n_head = static_cast<int>(r.get_int("model", "n_head", {}, 1, 4096));
  c.model.d_model = static_cast<int>(r.get_int("model", "d_model", {}, 1, 1 << 16));
  c.model.seq_len = static_cast<int>(r.get_int("model", "seq_len", {}, 1, 1 << 20));
  c.model.vocab_size = static_cast<int>(r.get_int("model", "vocab_size", {}, 2, 65536));
  c.model.tie_embeddings = r.get_bool("model", "tie_embeddings", true);
  if (c.model.d_model % c.model.n_head != 0) {
    r.fail("model", "n_head",
           "= " + std::to_string(c.model.n_head) + " does not divide model.d_model = " +
               std::to_string(c.model.d_model) + ": choose a head count that divides d_model");
  }

  // [parallel]
  c.parallel.pp = static_cast<int>(r.get_int("parallel", "pp", 1, 1, 65536));
  c.parallel.tp = static_cast<int>(r.get_int("parallel", "tp", 1, 1, 65536));
  c.parallel.dp = static_cast<int>(r.get_int("parallel", "dp", 0, 0, 1 << 24));
  c.parallel.virtual_stages = static_cast<int>(r.get_int("parallel", "virtual_stages", 1, 1, 64));
  c.parallel.schedule = r.get_enum(
      "parallel", "schedule", ScheduleKind::one_f_one_b,
      {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
       ScheduleKind::zb_h1, ScheduleKind::zb_v, ScheduleKind::dualpipev, ScheduleKind::two_bw});
  c.parallel.micro_batches = static_cast<int>(r.get_int("parallel", "micro_batches", 0, 0, kBig));
  if (const toml::node* p = r.raw("parallel", "partition"); p != nullptr && p->is_array()) {
    c.parallel.partition = PartitionKind::explicit_layers;
    for (const auto& e : *p->as_array()) {
      if (!e.is_integer() || *e.value<std::int64_t>() < 1 ||
          *e.value<std::int64_t>() > c.model.n_layer) {
        r.fail("parallel", "partition",
               "= " + describe(*p) +
                   ": an explicit partition is a list of layer counts "
                   "per stage, each >= 1 and at most model.n_layer");
      }
      c.parallel.partition_layers.push_back(static_cast<int>(*e.value<std::int64_t>()));
    }
  } else {
    c.parallel.partition =
        r.get_enum("parallel", "partition", PartitionKind::uniform,
                   {PartitionKind::uniform, PartitionKind::params, PartitionKind::time});
  }

  // [train]
  c.train.steps = static_cast<int>(r.get_int("train", "steps", {}, 1, kBig));
  c.train.global_batch = static_cast<int>(r.get_int("train", "global_batch", {}, 1, kBig));
  c.train.micro_batch = static_cast<int>(r.get_int("train", "micro_batch", {}, 1, kBig));
  c.train.lr = r.get_double("train", "lr", 3e-4, 0.0, 10.0, true);
  c.train.min_lr = r.get_double("train", "min_lr", c.train.lr / 10.0, 0.0, c.train.lr);
  c.train.warmup_steps = static_cast<int>(r.get_int("train", "warmup_steps", 0, 0, kBig));
  if (c.train.warmup_steps > c.train.steps) {
    c.warnings += "warning: train.warmup_steps = " + std::to_string(c.train.warmup_steps) +
                  " is more than train.steps = " + std::to_string(c.train.steps) +
                  ": every step warms up; the run is the first " + std::to_string(c.train.steps) +
                  " steps of the longer schedule\n";
  }
  c.train.weight_decay = r.get_double("train", "weight_decay", 0.1, 0.0, 10.0);
  c.train.grad_clip = r.get_double("train", "grad_clip", 1.0, 0.0, 1e6);
  c.train.recompute = r.get_enum("train", "recompute", Recompute::none,
                                 {Recompute::none, Recompute::selective, Recompute::full});
  c.train.beta1 = r.get_double("train", "beta1", 0.9, 0.0, 0.999999);
  c.train.beta2 = r.get_double("train", "beta2", 0.95, 0.0, 0.999999);
  c.train.eps = r.get_double("train", "eps", 1e-8, 0.0, 1.0, true);
  c.train.seed = static_cast<std::uint64_t>(
      r.get_int("train", "seed", 1337, 0, std::numeric_limits<std::int64_t>::max()));

  // [data]
  c.data.path = r.get_string("data", "path", {});
  c.data.val_path = r.get_string("data", "val_path", "");
  c.data.val_every = static_cast<int>(r.get_int("data", "val_every", 0, 0, kBig));
  c.data.val_batches = static_cast<int>(r.get_int("data", "val_batches", 4, 1, 1 << 20));
  if (c.data.path.empty()) r.fail("data", "path", "is empty: give the token file to train on");
  if (c.data.val_every > 0 && c.data.val_path.empty()) {
    r.fail("data", "val_every", "> 0 needs data.val_path (a token file of validation text)");
  }

  // [comm]
  std::vector<std::string> algos = {"auto"};
  for (AllreduceAlgo a : kAllreduceAlgos) algos.push_back(algorithm_name(a));
  const std::string allreduce = r.get_string("comm", "allreduce", "auto", algos);
  c.comm.allreduce = parse_allreduce(allreduce); // get_string accepted only these names
  c.comm.autotune = r.get_bool("comm", "autotune", true);
  c.comm.topology = r.get_enum(
      "comm", "topology", TopologyKind::automatic,
      {TopologyKind::automatic, TopologyKind::flat, TopologyKind::fat_tree, TopologyKind::tianhe});
  c.comm.calibration = r.get_string("comm", "calibration", "");
  if (!c.comm.calibration.empty() && c.comm.topology != TopologyKind::automatic) {
    r.fail("comm", "calibration",
           "is given together with comm.topology = \"" + std::string(name(c.comm.topology)) +
               "\": the calibration file replaces the preset; remove one of the two");
  }
  c.comm.overlap =
      r.get_enum("comm", "overlap", Overlap::none, {Overlap::none, Overlap::thread, Overlap::poll});
  if (c.comm.overlap == Overlap::poll && c.comm.allreduce &&
      *c.comm.allreduce != AllreduceAlgo::mpi) {
    r.fail("comm", "overlap",
           "= \"poll\" reduces with MPI_Iallreduce, the library's non-blocking all-reduce, "
           "so it cannot run comm.allreduce = \"" +
               allreduce + "\"; use comm.overlap = \"thread\" for that algorithm");
  }
  c.comm.gpu_collectives =
      r.get_enum("comm", "gpu_collectives", GpuTransport::automatic,
                 {GpuTransport::automatic, GpuTransport::nccl, GpuTransport::mpi});
  c.comm.gpu_p2p =
      r.get_enum("comm", "gpu_p2p", GpuTransport::mpi, {GpuTransport::mpi, GpuTransport::nccl});
  c.comm.bucket_mb = r.get_double("comm", "bucket_mb", 25.0, 0.0, 65536.0);
  c.comm.ranks_per_node = static_cast<int>(r.get_int("comm", "ranks_per_node", 0, 0, 1 << 20));

  // [device], [log], [runtime]
  c.device.kind =
      r.get_enum("device", "kind", DeviceKind::host, {DeviceKind::host, DeviceKind::cuda});
  c.device.precision = r.get_enum("device", "precision", Precision::fp32,
                                  {Precision::fp32, Precision::tf32, Precision::bf16});
  c.device.blas_threads = static_cast<int>(r.get_int("device", "blas_threads", 0, 0, 1024));
  c.log.every = static_cast<int>(r.get_int("log", "every", 1, 1, kBig));
  c.log.dir = r.get_string("log", "dir", "runs");
  c.log.trace = r.get_bool("log", "trace", false);
  // log.trace_steps = [first, last]: by default the second step (the first one allocates)
  c.log.trace_first = c.log.trace_last = std::min(2, std::max(1, c.train.steps));
  if (const toml::node* t = r.raw("log", "trace_steps")) {
    const toml::array* a = t->as_array();
    const bool two = a != nullptr && a->size() == 2 && (*a)[0].is_integer() && (*a)[1].is_integer();
    const long long first = two ? *(*a)[0].value<std::int64_t>() : 0;
    const long long last = two ? *(*a)[1].value<std::int64_t>() : 0;
    if (!two || first < 1 || first > last || last > c.train.steps) {
      r.fail("log", "trace_steps",
             "must be [first, last], two step numbers with 1 <= first <= last <= train.steps "
             "(e.g. [2, 3])");
    } else {
      c.log.trace_first = static_cast<int>(first);
      c.log.trace_last = static_cast<int>(last);
    }
  }
  c.log.op_profile = r.get_bool("log", "op_profile", false);
  c.runtime.hang_timeout_s = r.get_double("runtime", "hang_timeout_s", 600.0, 0.0, 1e7);
  c.runtime.deterministic = r.get_bool("runtime", "deterministic", false);
  c.runtime.exit_after_steps =
      static_cast<int>(r.get_int("runtime", "exit_after_steps", 0, 0, kBig));

  // [checkpoint]: present (in the deck or as an override) means checkpointing is on
  c.checkpoint.enabled = root.get("checkpoint") != nullptr;
  if (c.checkpoint.enabled) {
    c.checkpoint.dir = r.get_string("checkpoint", "dir", "checkpoints");
    c.checkpoint.every = static_cast<int>(r.get_int("checkpoint", "every", 0, 0, kBig));
    c.checkpoint.keep = static_cast<int>(r.get_int("checkpoint", "keep", 3, 1, 1 << 20));
    c.checkpoint.resume = r.get_string("checkpoint", "resume", "auto");
    if (c.checkpoint.dir.empty()) r.fail("checkpoint", "dir", "is empty: name a directory");
  }
  if (c.runtime.exit_after_steps > 0 && !c.checkpoint.enabled) {
    r.fail("runtime", "exit_after_steps",
           "> 0 stops the run to be continued, which needs checkpoints: add a [checkpoint] "
           "section (or checkpoint.dir=DIR)");
  }

  // ---- layout: does it fit the job? ----
  const int pp = c.parallel.pp;
  const int tp = c.parallel.tp;
  c.parallel.allow_tp_across_nodes = r.get_bool("parallel", "allow_tp_across_nodes", false);
  c.parallel.zero = static_cast<int>(r.get_int("parallel", "zero", 0, 0, 1));
  c.parallel.sequence_parallel = r.get_bool("parallel", "sequence_parallel", false);
  if (c.parallel.sequence_parallel && tp < 2) {
    r.fail("parallel", "sequence_parallel",
           "= true needs parallel.tp > 1: it splits the rows of the tensor-parallel group's "
           "replicated activations; set parallel.tp or remove the key");
  }
  if (c.parallel.sequence_parallel &&
      (static_cast<long long>(c.train.micro_batch) * c.model.seq_len) % tp != 0) {
    r.fail("parallel", "sequence_parallel",
           "= true splits a micro-batch's micro_batch * seq_len = " +
               std::to_string(static_cast<long long>(c.train.micro_batch) * c.model.seq_len) +
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
           "= " + std::to_string(c.model.n_layer) +
               " is fewer than pp * "
               "virtual_stages = " +
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
  if (c.parallel.zero == 1 && c.device.kind == DeviceKind::cuda) {
    r.fail("parallel", "zero",
           "= 1 runs on the host backend only so far (the CUDA backend's sharded update is not "
           "written); use parallel.zero = 0 with device.kind = \"cuda\"");
  }
  if (c.parallel.schedule == ScheduleKind::two_bw &&
      (c.parallel.zero == 1 || c.device.kind == DeviceKind::cuda)) {
    r.fail("parallel", "schedule",
           "= \"2bw\" runs on the host backend without ZeRO-1 so far (its two weight versions "
           "are not written for the CUDA backend or a sharded optimizer); use device.kind = "
           "\"host\" and parallel.zero = 0, or another schedule");
  }
  if (c.parallel.zero == 1 && c.comm.overlap != Overlap::none) {
    r.fail("parallel", "zero",
           "= 1 reduce-scatters the gradients after the schedule, so comm.overlap = \"" +
               std::string(name(c.comm.overlap)) +
               "\" cannot apply; use comm.overlap = \"none\" with parallel.zero = 1");
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
  if (c.device.kind == DeviceKind::host && c.device.precision != Precision::fp32) {
    r.fail("device", "precision",
           "= \"" + std::string(name(c.device.precision)) +
               "\" needs device.kind = \"cuda\": the host backend computes in fp32 only; use "
               "device.precision=\"fp32\"");
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
    const std::size_t want = static_cast<std::size_t>(pp * c.parallel.virtual_stages);
    if (c.parallel.partition_layers.size() != want || sum != c.model.n_layer) {
      r.fail("parallel", "partition",
             "lists " + std::to_string(c.parallel.partition_layers.size()) + " stages with " +
                 std::to_string(sum) +
                 " layers; it needs pp*virtual_stages = " + std::to_string(want) +
                 " entries summing to model.n_layer = " + std::to_string(c.model.n_layer));
    }
  }

  // the resolved deck records what this run does: derived values written out
  if (toml::table* par = root.get_as<toml::table>("parallel")) {
    par->insert_or_assign("dp", static_cast<std::int64_t>(c.parallel.dp));
    par->insert_or_assign("micro_batches", static_cast<std::int64_t>(c.parallel.micro_batches));
  }
  std::ostringstream os;
  os << root;
  c.resolved_text = os.str();
  return c;
}

} // namespace pt
