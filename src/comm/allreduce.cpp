#include "comm/allreduce.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "comm/watchdog.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

constexpr int kTag = 7301;

struct Comm {
  MPI_Comm c;
  int rank, size;
  explicit Comm(MPI_Comm comm) : c(comm) {
    PT_MPI(MPI_Comm_rank(c, &rank));
    PT_MPI(MPI_Comm_size(c, &size));
  }
};

void sendrecv(const float* send, std::size_t ns, int to, float* recv, std::size_t nr, int from,
              MPI_Comm c) {
  PT_MPI(MPI_Sendrecv(send, static_cast<int>(ns), MPI_FLOAT, to, kTag, recv, static_cast<int>(nr),
                      MPI_FLOAT, from, kTag, c, MPI_STATUS_IGNORE));
}

void add(float* acc, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
}

// Chunk k of n floats split in p nearly equal parts: [begin, end).
std::size_t chunk_begin(std::size_t n, int p, int k) {
  return n / static_cast<std::size_t>(p) * static_cast<std::size_t>(k) +
         std::min<std::size_t>(static_cast<std::size_t>(k), n % static_cast<std::size_t>(p));
}

// Chunk k (taken mod p) of n floats split over p ranks: [begin, end).
std::size_t ring_begin(std::size_t n, int p, int k) {
  return chunk_begin(n, p, ((k % p) + p) % p);
}
std::size_t ring_end(std::size_t n, int p, int k) {
  return chunk_begin(n, p, ((k % p) + p) % p + 1);
}

// Ring reduce-scatter, p-1 steps with neighbours: afterwards rank r holds the full sum of chunk
// (r + 1) mod p. Returns that chunk's index.
int ring_reduce_scatter(float* buf, std::size_t n, const Comm& cm, std::vector<float>& tmp) {
  const int p = cm.size, r = cm.rank;
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  if (tmp.size() < n / static_cast<std::size_t>(p) + 1) {
    tmp.resize(n / static_cast<std::size_t>(p) + 1);
  }
  for (int s = 0; s < p - 1; ++s) {
    const int send_k = r - s, recv_k = r - s - 1;
    const std::size_t sb = ring_begin(n, p, send_k), rb = ring_begin(n, p, recv_k);
    const std::size_t rn = ring_end(n, p, recv_k) - rb;
    sendrecv(buf + sb, ring_end(n, p, send_k) - sb, right, tmp.data(), rn, left, cm.c);
    add(buf + rb, tmp.data(), rn);
  }
  return (r + 1) % p;
}

// Ring all-gather after ring_reduce_scatter: every rank ends with every chunk.
void ring_all_gather(float* buf, std::size_t n, const Comm& cm) {
  const int p = cm.size, r = cm.rank;
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  for (int s = 0; s < p - 1; ++s) {
    const int send_k = r - s + 1, recv_k = r - s;
    const std::size_t sb = ring_begin(n, p, send_k), rb = ring_begin(n, p, recv_k);
    sendrecv(buf + sb, ring_end(n, p, send_k) - sb, right, buf + rb, ring_end(n, p, recv_k) - rb,
             left, cm.c);
  }
}

// Ring: reduce-scatter then all-gather, p-1 steps each, neighbours only.
void ring(float* buf, std::size_t n, const Comm& cm, std::vector<float>& tmp) {
  if (cm.size == 1 || n == 0) return;
  ring_reduce_scatter(buf, n, cm, tmp);
  ring_all_gather(buf, n, cm);
}

// Folds a non-power-of-two group to p2 = 2^floor(log2 p) ranks: among the first 2r ranks the
// even ones send their data to their odd neighbour and sit out. Returns the rank in the folded
// group, or -1 for a rank that sits out.
int fold(float* buf, std::size_t n, const Comm& cm, int& p2, std::vector<float>& tmp) {
  p2 = 1;
  while (p2 * 2 <= cm.size) p2 *= 2;
  const int rem = cm.size - p2;
  if (cm.rank < 2 * rem) {
    if (cm.rank % 2 == 0) {
      PT_MPI(MPI_Send(buf, static_cast<int>(n), MPI_FLOAT, cm.rank + 1, kTag, cm.c));
      return -1;
    }
    PT_MPI(MPI_Recv(tmp.data(), static_cast<int>(n), MPI_FLOAT, cm.rank - 1, kTag, cm.c,
                    MPI_STATUS_IGNORE));
    add(buf, tmp.data(), n);
    return cm.rank / 2;
  }
  return cm.rank - rem;
}

int unfold_rank(int newrank, int rem) {
  return newrank < rem ? 2 * newrank + 1 : newrank + rem;
}

// Gives the result back to the ranks that sat out of the folded group.
void unfold(float* buf, std::size_t n, const Comm& cm, int p2) {
  const int rem = cm.size - p2;
  if (cm.rank < 2 * rem) {
    if (cm.rank % 2 == 0) {
      PT_MPI(MPI_Recv(buf, static_cast<int>(n), MPI_FLOAT, cm.rank + 1, kTag, cm.c,
                      MPI_STATUS_IGNORE));
    } else {
      PT_MPI(MPI_Send(buf, static_cast<int>(n), MPI_FLOAT, cm.rank - 1, kTag, cm.c));
    }
  }
}

// Runs a power-of-two algorithm body(me, p2, rem) on any group size: folds the group to
// p2 = 2^floor(log2 p) ranks first (me = rank in the folded group; ranks that sit out skip the
// body) and gives the result back to the ranks that sat out afterwards.
template <class Body>
void on_power_of_two(float* buf, std::size_t n, const Comm& cm, std::vector<float>& tmp,
                     Body&& body) {
  if (cm.size == 1 || n == 0) return;
  if (tmp.size() < n) tmp.resize(n);
  int p2 = 1;
  const int me = fold(buf, n, cm, p2, tmp);
  if (me >= 0) body(me, p2, cm.size - p2);
  unfold(buf, n, cm, p2);
}

void recursive_doubling(float* buf, std::size_t n, const Comm& cm, std::vector<float>& tmp) {
  on_power_of_two(buf, n, cm, tmp, [&](int me, int p2, int rem) {
    for (int mask = 1; mask < p2; mask <<= 1) {
      const int partner = unfold_rank(me ^ mask, rem);
      sendrecv(buf, n, partner, tmp.data(), n, partner, cm.c);
      // the same operand order on both sides keeps the two copies bit-identical
      if ((me & mask) == 0) {
        add(buf, tmp.data(), n);
      } else {
        for (std::size_t i = 0; i < n; ++i) buf[i] = tmp[i] + buf[i];
      }
    }
  });
}

// Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling.
void rabenseifner(float* buf, std::size_t n, const Comm& cm, std::vector<float>& tmp) {
  on_power_of_two(buf, n, cm, tmp, [&](int me, int p2, int rem) {
    int lo = 0, hi = p2; // my chunk range [lo, hi) of p2 chunks
    for (int mask = p2 / 2; mask >= 1; mask >>= 1) {
      const int partner = unfold_rank(me ^ mask, rem);
      const int mid = (lo + hi) / 2;
      const bool keep_low = (me & mask) == 0;
      const int klo = keep_low ? lo : mid, khi = keep_low ? mid : hi;
      const int slo = keep_low ? mid : lo, shi = keep_low ? hi : mid;
      const std::size_t kb = chunk_begin(n, p2, klo), ke = chunk_begin(n, p2, khi);
      const std::size_t sb = chunk_begin(n, p2, slo), se = chunk_begin(n, p2, shi);
      sendrecv(buf + sb, se - sb, partner, tmp.data(), ke - kb, partner, cm.c);
      add(buf + kb, tmp.data(), ke - kb);
      lo = klo;
      hi = khi;
    }
    for (int mask = 1; mask < p2; mask <<= 1) {
      const int partner = unfold_rank(me ^ mask, rem);
      const bool low = (me & mask) == 0; // my range is the lower half of the merged range
      const int width = hi - lo;
      const int olo = low ? hi : lo - width, ohi = low ? hi + width : lo;
      const std::size_t mb = chunk_begin(n, p2, lo), me_ = chunk_begin(n, p2, hi);
      const std::size_t ob = chunk_begin(n, p2, olo), oe = chunk_begin(n, p2, ohi);
      sendrecv(buf + mb, me_ - mb, partner, buf + ob, oe - ob, partner, cm.c);
      lo = low ? lo : olo;
      hi = low ? ohi : hi;
    }
  });
}

// Floats per rank in the node's shared window: longer messages go through it in segments.
constexpr std::size_t kShmSegment = std::size_t{1} << 20;

} // namespace

std::optional<AllreduceAlgo> parse_allreduce(const std::string& name) {
  if (name == "auto") return std::nullopt;
  for (AllreduceAlgo a :
       {AllreduceAlgo::mpi, AllreduceAlgo::ring, AllreduceAlgo::recursive_doubling,
        AllreduceAlgo::rabenseifner, AllreduceAlgo::hierarchical, AllreduceAlgo::torus2d}) {
    if (name == algorithm_name(a)) return a;
  }
  throw std::invalid_argument("unknown all-reduce algorithm \"" + name + "\"");
}

// Two levels over rows of c consecutive ranks and the columns across them. When a row's ranks
// share memory (hierarchical's node), the row steps go through one MPI-3 shared window.
struct Allreducer::Groups {
  MPI_Comm row = MPI_COMM_NULL, col = MPI_COMM_NULL;
  bool shared = false; // the row's ranks share memory
  MPI_Win win = MPI_WIN_NULL;
  std::size_t win_floats = 0; // per rank
  std::vector<float*> slot;   // every row rank's part of the window
};

Allreducer::Allreducer(MPI_Comm comm, AllreduceOptions opt) : comm_(comm), opt_(std::move(opt)) {
  PT_MPI(MPI_Comm_rank(comm_, &rank_));
  PT_MPI(MPI_Comm_size(comm_, &size_));
}

Allreducer::~Allreducer() {
  for (auto& [c, g] : groups_) {
    if (g->win != MPI_WIN_NULL) {
      MPI_Win_unlock_all(g->win);
      MPI_Win_free(&g->win);
    }
    if (g->row != MPI_COMM_NULL) MPI_Comm_free(&g->row);
    if (g->col != MPI_COMM_NULL) MPI_Comm_free(&g->col);
    delete g;
  }
}

AllreduceAlgo Allreducer::algorithm_for(std::size_t n) const {
  if (opt_.algo) return *opt_.algo;
  if (n != last_n_) {
    last_algo_ = choose_algorithm(static_cast<double>(n) * sizeof(float), size_, opt_.node_size,
                                  opt_.topology);
    last_n_ = n;
  }
  return last_algo_;
}

Allreducer::Groups& Allreducer::groups(int c) {
  auto it = groups_.find(c);
  if (it != groups_.end()) return *it->second;
  auto* g = new Groups;
  groups_[c] = g;
  PT_MPI(MPI_Comm_split(comm_, rank_ / c, rank_, &g->row));
  PT_MPI(MPI_Comm_split(comm_, rank_ % c, rank_, &g->col));
  if (opt_.shared_memory) {
    MPI_Comm sh;
    PT_MPI(MPI_Comm_split_type(g->row, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &sh));
    int sh_size = 0;
    PT_MPI(MPI_Comm_size(sh, &sh_size));
    PT_MPI(MPI_Comm_free(&sh));
    g->shared = sh_size == c;
  }
  return *g;
}

// Node-local reduce-scatter and all-gather through the shared window, per segment of at most
// kShmSegment floats: every rank copies its segment in; rank k sums chunk k over all ranks'
// copies in rank order (the same bytes wherever it is computed), all-reduces it across the
// column, and writes it into rank 0's copy; every rank copies the result out.
void Allreducer::shm_two_level(float* buf, std::size_t n, Groups& g) {
  const Comm row(g.row), col(g.col);
  const std::size_t want = std::min(n, kShmSegment);
  if (g.win_floats < want) { // every row rank asks for the same size: a collective regrowth
    if (g.win != MPI_WIN_NULL) {
      PT_MPI(MPI_Win_unlock_all(g.win));
      PT_MPI(MPI_Win_free(&g.win));
    }
    MPI_Info info;
    PT_MPI(MPI_Info_create(&info));
    PT_MPI(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
    float* base = nullptr;
    PT_MPI(MPI_Win_allocate_shared(static_cast<MPI_Aint>(want * sizeof(float)), sizeof(float), info,
                                   g.row, &base, &g.win));
    PT_MPI(MPI_Info_free(&info));
    g.slot.assign(static_cast<std::size_t>(row.size), nullptr);
    for (int r = 0; r < row.size; ++r) {
      MPI_Aint bytes = 0;
      int unit = 0;
      PT_MPI(MPI_Win_shared_query(g.win, r, &bytes, &unit, &g.slot[static_cast<std::size_t>(r)]));
    }
    PT_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, g.win));
    g.win_floats = want;
  }
  auto sync = [&] { // make every rank's stores visible to the others
    PT_MPI(MPI_Win_sync(g.win));
    PT_MPI(MPI_Barrier(g.row));
    PT_MPI(MPI_Win_sync(g.win));
  };
  const int q = row.size, me = row.rank;
  if (tmp_.size() < want / static_cast<std::size_t>(q) + 1) {
    tmp_.resize(want / static_cast<std::size_t>(q) + 1);
  }
  for (std::size_t off = 0; off < n; off += want) {
    const std::size_t w = std::min(want, n - off);
    std::memcpy(g.slot[static_cast<std::size_t>(me)], buf + off, w * sizeof(float));
    sync();
    const std::size_t b = chunk_begin(w, q, me), e = chunk_begin(w, q, me + 1);
    float* acc = tmp_.data();
    std::memcpy(acc, g.slot[0] + b, (e - b) * sizeof(float));
    for (int r = 1; r < q; ++r) add(acc, g.slot[static_cast<std::size_t>(r)] + b, e - b);
    if (col.size > 1) rabenseifner(acc, e - b, col, tmp2_);
    std::memcpy(g.slot[0] + b, acc, (e - b) * sizeof(float));
    sync();
    std::memcpy(buf + off, g.slot[0], w * sizeof(float));
    sync(); // nobody overwrites the window before everyone has read it
  }
}

// Reduce-scatter inside rows of c consecutive ranks (ring, or the shared window), all-reduce of
// each owned chunk down the column (among ranks at the same position, Rabenseifner), all-gather
// inside the row. hierarchical: the rows are nodes (node_local: through the window when they
// share memory); torus2d: the rows of a near-square grid, always by messages.
void Allreducer::two_level(float* buf, std::size_t n, int c, bool node_local) {
  const Comm world(comm_);
  if (c <= 1 || c > size_ || size_ % c != 0) {
    rabenseifner(buf, n, world, tmp_);
    return;
  }
  Groups& g = groups(c);
  if (node_local && g.shared) {
    used_shm_ = true;
    shm_two_level(buf, n, g);
    return;
  }
  const Comm row(g.row), col(g.col);
  const int owned = ring_reduce_scatter(buf, n, row, tmp_);
  const std::size_t ob = ring_begin(n, row.size, owned);
  if (col.size > 1) rabenseifner(buf + ob, ring_end(n, row.size, owned) - ob, col, tmp_);
  ring_all_gather(buf, n, row);
}

void Allreducer::sum(float* buf, std::size_t n) {
  if (size_ == 1 || n == 0) return;
  const Comm cm(comm_);
  switch (algorithm_for(n)) {
  case AllreduceAlgo::mpi:
    if (opt_.watchdog != nullptr) {
      opt_.watchdog->allreduce_sum(buf, static_cast<int>(n), MPI_FLOAT, comm_, opt_.what);
    } else {
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_));
    }
    return;
  case AllreduceAlgo::ring:
    return ring(buf, n, cm, tmp_);
  case AllreduceAlgo::recursive_doubling:
    return recursive_doubling(buf, n, cm, tmp_);
  case AllreduceAlgo::rabenseifner:
    return rabenseifner(buf, n, cm, tmp_);
  case AllreduceAlgo::hierarchical:
    return two_level(buf, n, opt_.node_size, true);
  case AllreduceAlgo::torus2d: {
    const int c = grid_columns(size_);
    return two_level(buf, n, c >= size_ ? 0 : c, false);
  }
  }
}

void allreduce_sum(float* buf, std::size_t n, MPI_Comm comm, AllreduceAlgo algo, int node_size) {
  AllreduceOptions opt;
  opt.algo = algo;
  opt.node_size = node_size;
  Allreducer(comm, opt).sum(buf, n);
}

} // namespace pt
