#include "comm/alltoall.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "util/clock.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

constexpr int kTag = 0x7a2a; // every block of an exchange; the order of the calls tells them apart

std::vector<int> displacements(const int* counts, int p) {
  std::vector<int> d(static_cast<std::size_t>(p) + 1, 0);
  for (int q = 0; q < p; ++q) d[static_cast<std::size_t>(q) + 1] = d[q] + counts[q];
  return d;
}

} // namespace

const char* alltoall_name(AlltoallAlgo a) {
  switch (a) {
  case AlltoallAlgo::mpi:
    return "mpi";
  case AlltoallAlgo::pairwise:
    return "pairwise";
  case AlltoallAlgo::hierarchical:
    return "hierarchical";
  }
  return "?";
}

std::optional<AlltoallAlgo> parse_alltoall(const std::string& name) {
  for (AlltoallAlgo a : {AlltoallAlgo::mpi, AlltoallAlgo::pairwise, AlltoallAlgo::hierarchical}) {
    if (name == alltoall_name(a)) return a;
  }
  if (name == "auto") return std::nullopt;
  throw std::invalid_argument("unknown all-to-all algorithm '" + name +
                              "': mpi | pairwise | hierarchical | auto");
}

double modelled_alltoall(AlltoallAlgo a, double b, int p, int node_size, const Topology& t) {
  const int g = node_size > 1 && p % node_size == 0 ? node_size : 1, nodes = p / g;
  if (a == AlltoallAlgo::mpi) return -1.0;
  if (a == AlltoallAlgo::pairwise || g == 1 || nodes == 1) {
    // g - 1 steps inside the node, p - g across nodes with the node's g ranks on one link
    return (g - 1) * t.intra.message(b) + (p - g) * (t.inter.alpha + g * b * t.inter.beta);
  }
  // to the leader and back: g - 1 messages of p blocks each way through the leader's memory;
  // between leaders: nodes - 1 messages of g * g blocks
  return 2.0 * (g - 1) * t.intra.message(p * b) + (nodes - 1) * t.inter.message(g * g * b);
}

// hierarchical's groups: the node's ranks (leader first), and the leaders
struct Alltoaller::Node {
  MPI_Comm local = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  int g = 1, index = 0, nodes = 1; // ranks a node, this rank's place in it, nodes
};

Alltoaller::Alltoaller(MPI_Comm comm, AlltoallOptions opt) : opt_(std::move(opt)) {
  PT_MPI(MPI_Comm_dup(comm, &comm_));
  PT_MPI(MPI_Comm_rank(comm_, &rank_));
  PT_MPI(MPI_Comm_size(comm_, &size_));
  const int g = opt_.node_size;
  if (g > 1 && g < size_ && size_ % g == 0) { // nodes of consecutive ranks
    node_ = new Node;
    node_->g = g;
    node_->index = rank_ % g;
    node_->nodes = size_ / g;
    PT_MPI(MPI_Comm_split(comm_, rank_ / g, rank_, &node_->local));
    PT_MPI(MPI_Comm_split(comm_, node_->index == 0 ? 0 : MPI_UNDEFINED, rank_, &node_->leaders));
  }
}

Alltoaller::~Alltoaller() {
  if (node_ != nullptr) {
    MPI_Comm_free(&node_->local);
    if (node_->leaders != MPI_COMM_NULL) MPI_Comm_free(&node_->leaders);
    delete node_;
  }
  MPI_Comm_free(&comm_);
}

void Alltoaller::exchange_counts(const int* send_counts, int* recv_counts, int per) {
  for (int i = 0; i < size_ * per; ++i) {
    if (send_counts[i] < 0) {
      fatal(opt_.what + ": rank " + std::to_string(rank_) + " would send " +
            std::to_string(send_counts[i]) + " floats to rank " + std::to_string(i / per));
    }
  }
  const double t0 = wall_time();
  MPI_Request req;
  PT_MPI(MPI_Ialltoall(send_counts, per, MPI_INT, recv_counts, per, MPI_INT, comm_, &req));
  opt_.watchdog->count_collective();
  opt_.watchdog->wait(req, opt_.what + "'s counts");
  seconds_ += wall_time() - t0;
}

// Receives `count` floats from rank `from` of comm into buf (req: its request), after probing
// that the message holds that many: a wrong count ends the job naming both ranks (`who`: "rank"
// or "node"), rather than truncating or hanging.
void Alltoaller::receive_checked(float* buf, int count, int from, MPI_Comm comm, const char* who,
                                 MPI_Request& req) const {
  MPI_Status st;
  MPI_Message msg = MPI_MESSAGE_NULL;
  int found = 0;
  const std::string peer = std::string(who) + " " + std::to_string(from);
  opt_.watchdog->wait_until(
      [&] {
        PT_MPI(MPI_Improbe(from, kTag, comm, &found, &msg, &st));
        return found != 0;
      },
      opt_.what + ": the blocks from " + peer);
  int got = 0;
  PT_MPI(MPI_Get_count(&st, MPI_FLOAT, &got));
  if (got != count) wrong_count(peer, got, count);
  PT_MPI(MPI_Imrecv(buf, count, MPI_FLOAT, &msg, &req)); // the message probed, none other
}

void Alltoaller::wrong_count(const std::string& peer, long got, long want) const {
  fatal(opt_.what + ": " + peer + " sent " + std::to_string(got) + " floats to rank " +
        std::to_string(rank_) + ", whose counts said " + std::to_string(want) +
        ": the ranks disagree on the routing");
}

// Sends n floats to `to` while receiving `count` checked floats from `from` (ranks of comm).
void Alltoaller::swap(const float* out, int n, int to, float* in, int count, int from,
                      MPI_Comm comm, const char* who) const {
  MPI_Request r[2];
  PT_MPI(MPI_Isend(out, n, MPI_FLOAT, to, kTag, comm, &r[0]));
  receive_checked(in, count, from, comm, who, r[1]);
  opt_.watchdog->wait(r[1], opt_.what + ": the blocks from " + who + " " + std::to_string(from));
  opt_.watchdog->wait(r[0], opt_.what + ": the blocks to " + who + " " + std::to_string(to));
}

void Alltoaller::pairwise(const float* send, const int* sc, float* recv, const int* rc) {
  const std::vector<int> sd = displacements(sc, size_), rd = displacements(rc, size_);
  std::memcpy(recv + rd[rank_], send + sd[rank_], static_cast<std::size_t>(sc[rank_]) * 4);
  for (int s = 1; s < size_; ++s) {
    const int to = (rank_ + s) % size_, from = (rank_ - s + size_) % size_;
    swap(send + sd[to], sc[to], to, recv + rd[from], rc[from], from, comm_, "rank");
  }
}

void Alltoaller::library(const float* send, const int* sc, float* recv, const int* rc) {
  const std::vector<int> sd = displacements(sc, size_), rd = displacements(rc, size_);
  MPI_Request req;
  PT_MPI(
      MPI_Ialltoallv(send, sc, sd.data(), MPI_FLOAT, recv, rc, rd.data(), MPI_FLOAT, comm_, &req));
  opt_.watchdog->wait(req, opt_.what + " (MPI_Alltoallv)");
}

// hierarchical's leader: every local rank's send and receive counts (g x 2p, as gathered), its
// sends (tmp_, rank after rank) and where block (local source i, rank q) lies in them
struct Alltoaller::Gathered {
  int p = 0;
  std::vector<int> counts, at;
  int sent(int i, int q) const { return counts[static_cast<std::size_t>(2 * i * p + q)]; }
  int got(int j, int q) const { return counts[static_cast<std::size_t>(2 * j * p + p + q)]; }
};

// hierarchical (see the header): the leader gathers its ranks' send buffers and counts,
// exchanges with each other leader the blocks from its ranks to that node's ranks (by source,
// then destination), and hands each of its ranks its blocks in source rank order.
void Alltoaller::hierarchical(const float* send, const int* sc, float* recv, const int* rc) {
  Node& n = *node_;
  const int p = size_, g = n.g;
  const bool leader = n.index == 0;
  Gathered G{p, std::vector<int>(leader ? static_cast<std::size_t>(2 * g * p) : 0), {}};
  std::vector<int> mine(sc, sc + p);
  mine.insert(mine.end(), rc, rc + p);
  MPI_Request req;
  PT_MPI(
      MPI_Igather(mine.data(), 2 * p, MPI_INT, G.counts.data(), 2 * p, MPI_INT, 0, n.local, &req));
  opt_.watchdog->wait(req, opt_.what + ": the counts to the node's leader");
  std::vector<int> each_send(static_cast<std::size_t>(g)), each_recv(each_send.size());
  for (int i = 0; leader && i < g; ++i) {
    for (int q = 0; q < p; ++q) each_send[i] += G.sent(i, q), each_recv[i] += G.got(i, q);
  }
  const std::vector<int> gs = displacements(each_send.data(), g),
                         rs = displacements(each_recv.data(), g);
  grow_scratch(tmp_, leader ? static_cast<std::size_t>(gs[g]) : 0);
  PT_MPI(MPI_Igatherv(send, std::accumulate(sc, sc + p, 0), MPI_FLOAT, tmp_.data(),
                      each_send.data(), gs.data(), MPI_FLOAT, 0, n.local, &req));
  opt_.watchdog->wait(req, opt_.what + ": the blocks to the node's leader");
  if (leader) {
    G.at.resize(static_cast<std::size_t>(g * p));
    for (int i = 0; i < g; ++i) {
      int o = gs[i];
      for (int q = 0; q < p; ++q) G.at[static_cast<std::size_t>(i * p + q)] = o, o += G.sent(i, q);
    }
    leaders_exchange(G, rs);
  }
  PT_MPI(MPI_Iscatterv(out_.data(), each_recv.data(), rs.data(), MPI_FLOAT, recv,
                       std::accumulate(rc, rc + p, 0), MPI_FLOAT, 0, n.local, &req));
  opt_.watchdog->wait(req, opt_.what + ": the blocks from the node's leader");
}

// The leader's part: out_ gets each local rank j's receives at rs[j], in source rank order.
void Alltoaller::leaders_exchange(const Gathered& G, const std::vector<int>& rs) {
  const Node& n = *node_;
  const int p = size_, g = n.g, me = rank_ / g;
  grow_scratch(out_, static_cast<std::size_t>(rs[g]));
  // where local rank j's block from rank q goes in out_: its receives in source rank order
  std::vector<int> place(static_cast<std::size_t>(g * p));
  for (int j = 0; j < g; ++j) {
    int at = rs[j];
    for (int q = 0; q < p; ++q) place[static_cast<std::size_t>(j * p + q)] = at, at += G.got(j, q);
  }
  for (int s = 0; s < n.nodes; ++s) { // s = 0: the blocks within the node
    const int to = (me + s) % n.nodes, from = (me - s + n.nodes) % n.nodes;
    pack_.clear();
    for (int i = 0; i < g; ++i) {
      for (int j = 0; j < g; ++j) {
        const float* b = tmp_.data() + G.at[static_cast<std::size_t>(i * p + to * g + j)];
        pack_.insert(pack_.end(), b, b + G.sent(i, to * g + j));
      }
    }
    int expect = 0;
    for (int i = 0; i < g; ++i) {
      for (int j = 0; j < g; ++j) expect += G.got(j, from * g + i);
    }
    grow_scratch(tmp2_, static_cast<std::size_t>(expect));
    if (s > 0) {
      swap(pack_.data(), static_cast<int>(pack_.size()), to, tmp2_.data(), expect, from, n.leaders,
           "node");
    } else if (static_cast<int>(pack_.size()) != expect) {
      wrong_count("node " + std::to_string(me), static_cast<long>(pack_.size()), expect);
    } else {
      std::copy(pack_.begin(), pack_.end(), tmp2_.begin());
    }
    // (source i of node `from`, destination j here), i-major: each to its place in rank order
    const float* b = tmp2_.data();
    for (int i = 0; i < g; ++i) {
      for (int j = 0; j < g; ++j) {
        const int c = G.got(j, from * g + i);
        std::copy(b, b + c, out_.begin() + place[static_cast<std::size_t>(j * p + from * g + i)]);
        b += c;
      }
    }
  }
}

void Alltoaller::run(AlltoallAlgo a, const float* send, const int* sc, float* recv, const int* rc) {
  opt_.watchdog->count_collective();
  if (a == AlltoallAlgo::mpi) return library(send, sc, recv, rc);
  if (a == AlltoallAlgo::hierarchical && node_ != nullptr) return hierarchical(send, sc, recv, rc);
  pairwise(send, sc, recv, rc);
}

AlltoallAlgo Alltoaller::algorithm_for(std::size_t cls) const {
  if (opt_.algo) return *opt_.algo;
  const auto m = measured_.find(cls);
  if (m != measured_.end()) return m->second;
  const double b = static_cast<double>(cls);
  const bool hier =
      node_ != nullptr &&
      modelled_alltoall(AlltoallAlgo::hierarchical, b, size_, opt_.node_size, opt_.topology) <
          modelled_alltoall(AlltoallAlgo::pairwise, b, size_, opt_.node_size, opt_.topology);
  return hier ? AlltoallAlgo::hierarchical : AlltoallAlgo::pairwise;
}

// auto's one timing of each candidate (the slowest rank's), and its pick (auto_pick)
AlltoallAlgo Alltoaller::measure(const float* send, const int* sc, float* recv, const int* rc,
                                 std::size_t cls) {
  const AlltoallAlgo model = algorithm_for(cls);
  std::vector<AlltoallAlgo> cands = {AlltoallAlgo::mpi, AlltoallAlgo::pairwise};
  if (node_ != nullptr) cands.push_back(AlltoallAlgo::hierarchical);
  std::vector<double> t(cands.size());
  for (std::size_t k = 0; k < cands.size(); ++k) {
    const double t0 = wall_time();
    run(cands[k], send, sc, recv, rc);
    t[k] = wall_time() - t0;
  }
  opt_.watchdog->allreduce(t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, comm_,
                           opt_.what + ": auto's timing");
  std::vector<std::pair<AlltoallAlgo, double>> seconds;
  for (std::size_t k = 0; k < cands.size(); ++k) seconds.emplace_back(cands[k], t[k]);
  return auto_pick(seconds, model);
}

void Alltoaller::exchange(const float* send, const int* sc, float* recv, const int* rc,
                          std::size_t class_bytes) {
  if (class_bytes == 0) {
    for (int q = 0; q < size_; ++q) {
      class_bytes = std::max(class_bytes, static_cast<std::size_t>(sc[q]) * sizeof(float));
    }
  }
  // size classes: powers of two
  const std::size_t cls =
      std::size_t{1} << static_cast<int>(
          std::ceil(std::log2(static_cast<double>(std::max<std::size_t>(class_bytes, 1)))));
  const double t0 = wall_time();
  if (!opt_.algo && opt_.autotune && measured_.count(cls) == 0) {
    measured_[cls] = measure(send, sc, recv, rc, cls); // each candidate delivers the same blocks
  } else {
    run(algorithm_for(cls), send, sc, recv, rc);
  }
  seconds_ += wall_time() - t0;
}

} // namespace pt
