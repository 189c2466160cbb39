#include "comm/topology.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "util/errors.hpp"

namespace pt {
namespace {

// Defaults (docs/collectives.md gives the sources). Inside a node: MPI shared-memory transport
// and a float32 sum at memory speed. Between nodes: HDR InfiniBand class (200 Gbit/s, ~1.5 us
// MPI latency) or Tianhe-2A (TH Express-2A: about 1 us and 14 Gbit/s per link, Dongarra 2017).
// A byte copied into or out of a shared window costs half a byte of a shared-memory message:
// the transport copies a message twice (into its buffer and out), the window once.
const LinkCost kSharedMemory{0.4e-6, 1.0 / 10e9, 1.0 / 4e9, 1.0 / 20e9};
const LinkCost kInfiniBandHdr{1.5e-6, 1.0 / 23e9, 1.0 / 4e9, 1.0 / 10e9};
const LinkCost kTianhe2A{1.0e-6, 8.0 / 14e9, 1.0 / 4e9, 1.0 / 10e9};

// One step of a pairwise exchange: `bytes` each way, `share` ranks of a node using the node's
// network link at once (modelled as one message of share * bytes).
double xfer(const LinkCost& l, double bytes, double share) {
  return l.message(bytes * share);
}

struct Shape {
  int p, g, nodes; // ranks, ranks per node (consecutive), nodes
  Shape(int p_, int node_size) : p(p_), g(node_size), nodes(1) {
    if (g >= p) {
      g = p; // one node
    } else if (g <= 1 || p % g != 0) {
      g = 1; // nodes of unequal size: modelled as one rank per node
    }
    nodes = p / g;
  }
  // the link between ranks at distance d (consecutive nodes of g ranks)
  const LinkCost& link(int d, const Topology& t) const {
    return nodes > 1 && d >= g ? t.inter : t.intra;
  }
  // ranks of a node that use its network link at once when every rank talks across distance d
  double share(int d) const { return nodes > 1 && d >= g ? g : 1; }
};

int floor_pow2(int p) {
  int q = 1;
  while (q * 2 <= p) q *= 2;
  return q;
}

// The fold of a non-power-of-two group (neighbouring pairs) and the unfold afterwards.
double fold_cost(double n, const Shape& s, const Topology& t) {
  if (floor_pow2(s.p) == s.p) return 0.0;
  const LinkCost& l = s.link(1, t);
  return 2 * xfer(l, n, 1) + n * l.gamma;
}

double ring_time(double n, const Shape& s, const Topology& t) {
  const int p = s.p;
  if (p == 1) return 0.0;
  const LinkCost& l = s.nodes > 1 ? t.inter : t.intra; // the slowest link of the ring
  return 2.0 * (p - 1) * xfer(l, n / p, 1) + (p - 1.0) / p * n * l.gamma;
}

double recursive_doubling_time(double n, const Shape& s, const Topology& t) {
  const int p2 = floor_pow2(s.p);
  double time = fold_cost(n, s, t);
  for (int mask = 1; mask < p2; mask <<= 1) {
    const LinkCost& l = s.link(mask, t);
    time += xfer(l, n, s.share(mask)) + n * l.gamma;
  }
  return time;
}

double rabenseifner_time(double n, const Shape& s, const Topology& t) {
  const int p2 = floor_pow2(s.p);
  double time = fold_cost(n, s, t);
  for (int mask = p2 / 2; mask >= 1; mask >>= 1) { // halving, then doubling: same sizes
    const LinkCost& l = s.link(mask, t);
    const double bytes = n * mask / p2;
    time += 2 * xfer(l, bytes, s.share(mask)) + bytes * l.gamma;
  }
  return time;
}

// hierarchical's node-local step through the shared window, g ranks: per segment three
// barriers (a dissemination barrier: ceil(log2 g) exchanges of nothing); each rank copies the
// g-1 chunks it does not own into the window and the g-1 sums of the others out of it, and adds
// g-1 copies of its own n/g chunk
double shm_node_time(double n, int g, const LinkCost& l) {
  int rounds = 0;
  while ((1 << rounds) < g) ++rounds;
  const double segments =
      std::ceil(n / (sizeof(float) * static_cast<double>(kWindowSegmentFloats)));
  const double others = (g - 1.0) / g * n; // bytes of the chunks a rank does not own
  return segments * 3.0 * rounds * l.message(0.0) + 2.0 * others * l.copy + others * l.gamma;
}

// Reduce-scatter and all-gather around rings of c consecutive ranks, then an all-reduce of each
// owned chunk (n/c bytes) among the p/c ranks at the same position (Rabenseifner). allreduce.cpp
// runs hierarchical with c = ranks per node and torus2d with c = columns of a near-square grid.
double two_level_time(double n, const Shape& s, int c, const Topology& t, bool window) {
  const int rows = s.p / c;
  // rows inside nodes use memory; rows spanning nodes are rings over the network
  const bool row_inside = s.nodes == 1 || s.g % c == 0;
  const LinkCost& lr = row_inside ? t.intra : t.inter;
  double time = window && row_inside
                    ? shm_node_time(n, c, lr)
                    : 2.0 * (c - 1) * xfer(lr, n / c, 1) + (c - 1.0) / c * n * lr.gamma;
  if (rows > 1) {
    // column members sit c ranks apart: on different nodes unless one node holds several rows
    const Shape col(rows, 1); // each column member on its own node of the column
    Topology tc = t;
    const bool col_inside = s.nodes == 1 || c < s.g;
    if (col_inside) tc.inter = t.intra;
    const double share = col_inside ? 1.0 : std::min(s.g, c);
    tc.inter.beta *= share; // the node's link is shared by its ranks in different columns
    time += rabenseifner_time(n / c, col, tc);
  }
  return time;
}

// A positive number of the file in (0, most], or [least, most] when least > 0. The bounds lie far
// beyond any machine's (a second per message, 1 kB/s to 1 PB/s, a millisecond per byte) and keep
// every modelled time a finite number of seconds.
double number(const toml::table& tbl, const char* key, const std::string& where, double least,
              double most) {
  const toml::node* n = tbl.get(key);
  if (n == nullptr || !(n->is_number())) {
    throw input_error(where + ": \"" + key +
                      "\" is missing or not a number.\n---> HINT: rerun `pipetrain-bench "
                      "calibrate` to write a fresh file");
  }
  const double v =
      n->is_integer() ? static_cast<double>(n->as_integer()->get()) : n->as_floating_point()->get();
  if (!(v > 0.0) || !(v >= least) || !(v <= most)) {
    std::ostringstream msg;
    msg << where << ": \"" << key << "\" must be a positive number in " << (least > 0.0 ? "[" : "(")
        << least << ", " << most << "], found " << v
        << ".\n---> HINT: rerun `pipetrain-bench calibrate` to write a fresh file";
    throw input_error(msg.str());
  }
  return v;
}

LinkCost read_level(const toml::table& root, const char* level, const std::string& path) {
  const toml::table* t = root.get_as<toml::table>(level);
  const std::string where = path + " [" + level + "]";
  if (t == nullptr) {
    throw input_error(path + ": no [" + level +
                      "] table; a calibration file has [intra] and [inter].\n---> HINT: rerun "
                      "`pipetrain-bench calibrate` to write a fresh file");
  }
  LinkCost l;
  l.alpha = number(*t, "alpha_us", where, 0.0, 1e6) * 1e-6;
  l.beta = 1.0 / (number(*t, "bandwidth_GBps", where, 1e-6, 1e6) * 1e9);
  l.gamma = number(*t, "gamma_ns_per_byte", where, 0.0, 1e6) * 1e-9;
  l.copy =
      t->get("copy_ns_per_byte") ? number(*t, "copy_ns_per_byte", where, 0.0, 1e6) * 1e-9 : l.beta;
  return l;
}

} // namespace

int grid_columns(int p) {
  int rows = 1;
  for (int d = 1; d * d <= p; ++d) {
    if (p % d == 0) rows = d;
  }
  return p / rows;
}

Topology topology_preset(const std::string& name) {
  if (name == "fat-tree") return Topology{name, kSharedMemory, kInfiniBandHdr, true};
  if (name == "tianhe") return Topology{name, kSharedMemory, kTianhe2A, true};
  if (name == "flat") return Topology{name, kInfiniBandHdr, kInfiniBandHdr, true};
  if (name == "node") return Topology{name, kSharedMemory, kSharedMemory, true};
  throw std::invalid_argument("unknown topology \"" + name + "\" (flat, fat-tree, tianhe or node)");
}

Topology load_calibration(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "comm.calibration: cannot read " << path << ": " << e.description() << " (line "
        << e.source().begin.line
        << ").\n---> HINT: give the file `pipetrain-bench calibrate --out FILE` wrote";
    throw input_error(msg.str());
  }
  Topology t;
  t.name = path;
  t.intra = read_level(root, "intra", path);
  t.inter = read_level(root, "inter", path);
  const toml::table* inter = root.get_as<toml::table>("inter");
  t.inter_measured =
      inter->get_as<bool>("measured") == nullptr || inter->get_as<bool>("measured")->get();
  return t;
}

Topology resolve_topology(const std::string& topology, const std::string& calibration, int nodes) {
  if (!calibration.empty()) return load_calibration(calibration);
  if (topology == "auto") return topology_preset(nodes > 1 ? "fat-tree" : "node");
  return topology_preset(topology);
}

std::string calibration_toml(const Topology& t, const std::string& header) {
  std::ostringstream o;
  std::istringstream h(header);
  for (std::string line; std::getline(h, line);) o << "# " << line << "\n";
  auto level = [&](const char* name, const LinkCost& l, bool measured) {
    o << "\n[" << name << "]\n";
    o << "alpha_us = " << l.alpha * 1e6 << "\n";
    o << "bandwidth_GBps = " << 1.0 / l.beta / 1e9 << "\n";
    o << "gamma_ns_per_byte = " << l.gamma * 1e9 << "\n";
    o << "copy_ns_per_byte = " << l.copy * 1e9 << "\n";
    o << "measured = " << (measured ? "true" : "false") << "\n";
  };
  level("intra", t.intra, true);
  level("inter", t.inter, t.inter_measured);
  return o.str();
}

double modelled_time(AllreduceAlgo algo, double bytes, int p, int node_size, const Topology& t) {
  const Shape s(p, node_size);
  if (p <= 1 || bytes <= 0.0) return algo == AllreduceAlgo::mpi ? -1.0 : 0.0;
  switch (algo) {
  case AllreduceAlgo::mpi:
    return -1.0;
  case AllreduceAlgo::ring:
    return ring_time(bytes, s, t);
  case AllreduceAlgo::recursive_doubling:
    return recursive_doubling_time(bytes, s, t);
  case AllreduceAlgo::rabenseifner:
    return rabenseifner_time(bytes, s, t);
  case AllreduceAlgo::hierarchical:
  case AllreduceAlgo::torus2d: {
    const int c = two_level_row(algo, p, node_size);
    if (c == 0) return rabenseifner_time(bytes, s, t);
    return two_level_time(bytes, s, c, t, algo == AllreduceAlgo::hierarchical);
  }
  }
  return -1.0;
}

int two_level_row(AllreduceAlgo algo, int p, int node_size) {
  if (algo == AllreduceAlgo::hierarchical) {
    const int g = std::min(node_size, p);
    return g > 1 && p % g == 0 ? g : 0;
  }
  if (algo == AllreduceAlgo::torus2d) {
    const int c = grid_columns(p);
    return c > 1 && c < p ? c : 0;
  }
  return 0;
}

double bandwidth_bound(double bytes, int p, int node_size, const Topology& t) {
  const Shape s(p, node_size);
  if (p <= 1) return 0.0;
  if (s.nodes > 1) return 2.0 * (s.nodes - 1) / s.nodes * bytes * t.inter.beta;
  return 2.0 * (p - 1) / p * bytes * t.intra.beta;
}

const std::vector<AllreduceAlgo>& modelled_algorithms() {
  static const std::vector<AllreduceAlgo> all = {
      AllreduceAlgo::ring, AllreduceAlgo::recursive_doubling, AllreduceAlgo::rabenseifner,
      AllreduceAlgo::hierarchical, AllreduceAlgo::torus2d};
  return all;
}

AllreduceAlgo choose_algorithm(double bytes, int p, int node_size, const Topology& t) {
  AllreduceAlgo best = AllreduceAlgo::ring;
  double best_t = modelled_time(best, bytes, p, node_size, t);
  for (AllreduceAlgo a : modelled_algorithms()) {
    const double x = modelled_time(a, bytes, p, node_size, t);
    if (x < best_t * (1.0 - 1e-9)) { // ties keep the earlier (simpler) algorithm
      best = a;
      best_t = x;
    }
  }
  return best;
}

} // namespace pt
