#include "comm/layout.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "comm/group.hpp"
#include "util/errors.hpp"

namespace pt {

Coords coords_of(int rank, int pp, int dp, int tp) {
  (void)pp;
  return Coords{rank / (tp * dp), (rank / tp) % dp, rank % tp};
}

std::pair<int, int> group_nodes(const std::vector<int>& node_of) {
  std::vector<int> seen; // nodes in order of their first rank
  std::vector<int> block;
  for (std::size_t r = 0; r < node_of.size(); ++r) {
    if (r > 0 && node_of[r] == node_of[r - 1]) {
      ++block.back();
      continue;
    }
    seen.push_back(node_of[r]);
    block.push_back(1);
  }
  std::vector<int> distinct = seen;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const bool regular =
      distinct.size() == seen.size() &&
      std::all_of(block.begin(), block.end(), [&](int b) { return b == block[0]; });
  return {static_cast<int>(distinct.size()), regular ? block[0] : 1};
}

namespace {

// group_nodes of the `size` ranks of comm, this one on node `node` (collective)
std::pair<int, int> group_nodes(MPI_Comm comm, int size, int node) {
  std::vector<int> node_of(static_cast<std::size_t>(size));
  PT_MPI(MPI_Allgather(&node, 1, MPI_INT, node_of.data(), 1, MPI_INT, comm));
  return pt::group_nodes(node_of);
}

} // namespace

Layout::Layout(MPI_Comm world, const ParallelConfig& p, const CommConfig& c)
    : world_(world), pp_(p.pp), dp_(p.dp), tp_(p.tp), ep_(p.ep) {
  PT_MPI(MPI_Comm_rank(world_, &rank_));
  PT_MPI(MPI_Comm_size(world_, &size_));
  me_ = coords_of(rank_, pp_, dp_, tp_);
  PT_MPI(MPI_Comm_split(world_, me_.pp * tp_ + me_.tp, me_.dp, &dp_comm_));
  PT_MPI(MPI_Comm_split(world_, me_.dp * tp_ + me_.tp, me_.pp, &pp_comm_));
  PT_MPI(MPI_Comm_split(world_, me_.pp * dp_ + me_.dp, me_.tp, &tp_comm_));
  const bool edge = pp_ > 1 && (me_.pp == 0 || me_.pp == pp_ - 1);
  PT_MPI(MPI_Comm_split(world_, edge ? me_.dp * tp_ + me_.tp : MPI_UNDEFINED, me_.pp, &emb_comm_));
  if (ep_ > 1) { // within the dp group: blocks of ep ranks, and the ranks at one place in them
    PT_MPI(MPI_Comm_split(dp_comm_, me_.dp / ep_, me_.dp % ep_, &ep_comm_));
    PT_MPI(MPI_Comm_split(dp_comm_, me_.dp % ep_, me_.dp / ep_, &edp_comm_));
  }

  // Nodes: ranks sharing memory, or blocks of comm.ranks_per_node consecutive ranks (lets one
  // machine pretend to be several nodes in tests).
  int node_key = 0;
  if (c.ranks_per_node > 0) {
    node_key = rank_ / c.ranks_per_node;
    PT_MPI(MPI_Comm_split(world_, node_key, rank_, &node_comm_));
  } else {
    PT_MPI(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm_));
    int leader = rank_;
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node_comm_));
    node_key = leader;
  }
  PT_MPI(MPI_Comm_size(node_comm_, &ranks_on_node_));
  std::vector<int> keys(static_cast<std::size_t>(size_));
  PT_MPI(MPI_Allgather(&node_key, 1, MPI_INT, keys.data(), 1, MPI_INT, world_));
  std::vector<int> distinct = keys;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  nodes_ = static_cast<int>(distinct.size());
  auto index = [&](int key) {
    return static_cast<int>(std::lower_bound(distinct.begin(), distinct.end(), key) -
                            distinct.begin());
  };
  node_ = index(node_key);

  // the dp group's nodes, and the expert-parallel group's (its all-to-all's), from where their
  // ranks really are (a node need not hold every stage)
  std::tie(dp_nodes_, dp_node_size_) = group_nodes(dp_comm_, dp_, node_);
  if (ep_ > 1) std::tie(ep_nodes_, ep_node_size_) = group_nodes(ep_comm_, ep_, node_);

  // a tensor-parallel group should sit inside one node (its all-reduces are on the critical path)
  int lo = node_, hi = node_;
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, tp_comm_));
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, tp_comm_));
  int spans = lo != hi ? 1 : 0;
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &spans, 1, MPI_INT, MPI_MAX, world_));
  if (spans) {
    const std::string what = "a tensor-parallel group spans nodes (tp = " + std::to_string(tp_) +
                             "): its all-reduces, several per layer, would cross the network";
    if (!p.allow_tp_across_nodes) {
      throw input_error("parallel.tp: " + what +
                        ". Run a multiple of tp ranks per node, or set "
                        "parallel.allow_tp_across_nodes = true");
    }
    warnings_ = "warning: " + what + "\n";
  }

  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  PT_MPI(MPI_Get_processor_name(host, &len));
  std::vector<char> all(rank_ == 0 ? static_cast<std::size_t>(size_) * MPI_MAX_PROCESSOR_NAME : 1);
  PT_MPI(MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                    MPI_CHAR, 0, world_));
  if (rank_ == 0) {
    for (int r = 0; r < size_; ++r) {
      hosts_.emplace_back(all.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME);
      node_of_.push_back(index(keys[static_cast<std::size_t>(r)]));
    }
  }
}

Layout::~Layout() {
  for (MPI_Comm* c :
       {&dp_comm_, &pp_comm_, &tp_comm_, &emb_comm_, &ep_comm_, &edp_comm_, &node_comm_}) {
    free_comm(*c);
  }
}

std::string Layout::table(const Placement* placement) const {
  if (rank_ != 0) return {};
  std::ostringstream os;
  os << "layout: pp " << pp_ << " x dp " << dp_ << " x tp " << tp_ << " = " << size_ << " ranks";
  if (ep_ > 1) os << " (expert parallelism: dp in groups of ep " << ep_ << ")";
  os << " on " << nodes_ << " node(s)\n";
  const bool placed = placement != nullptr && placement->cores.size() == hosts_.size();
  os << "  rank  node  pp  dp  tp  " << (placed ? "threads  cores           " : "") << "host\n";
  constexpr int kShown = 64; // a big job prints the first ranks only
  for (int r = 0; r < size_ && r < kShown; ++r) {
    const Coords c = coords_of(r, pp_, dp_, tp_);
    char line[256];
    const auto i = static_cast<std::size_t>(r);
    char place[96] = "";
    if (placed) {
      std::snprintf(place, sizeof place, "%7d  %-14s  ", placement->threads_of[i],
                    placement->cores[i].c_str());
    }
    std::snprintf(line, sizeof line, "  %4d  %4d  %2d  %2d  %2d  %s%s\n", r, node_of_[i], c.pp,
                  c.dp, c.tp, place, hosts_[i].c_str());
    os << line;
  }
  if (size_ > kShown) os << "  ... " << (size_ - kShown) << " more ranks\n";
  return os.str();
}

} // namespace pt
