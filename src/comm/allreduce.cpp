#include "comm/allreduce.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "util/clock.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

constexpr int kTag = 7301;

int as_count(std::size_t n) {
  return static_cast<int>(n);
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
int ring_reduce_scatter(float* buf, std::size_t n, const ReduceComm& c, CountedVector<float>& tmp) {
  const int p = c.size, r = c.rank;
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  grow_scratch(tmp, n / static_cast<std::size_t>(p) + 1);
  for (int s = 0; s < p - 1; ++s) {
    const int send_k = r - s, recv_k = r - s - 1;
    const std::size_t sb = ring_begin(n, p, send_k), rb = ring_begin(n, p, recv_k);
    const std::size_t rn = ring_end(n, p, recv_k) - rb;
    c.exchange(buf + sb, ring_end(n, p, send_k) - sb, right, tmp.data(), rn, left);
    add(buf + rb, tmp.data(), rn);
  }
  return (r + 1) % p;
}

// Ring all-gather after ring_reduce_scatter: every rank ends with every chunk.
void ring_all_gather(float* buf, std::size_t n, const ReduceComm& c) {
  const int p = c.size, r = c.rank;
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  for (int s = 0; s < p - 1; ++s) {
    const int send_k = r - s + 1, recv_k = r - s;
    const std::size_t sb = ring_begin(n, p, send_k), rb = ring_begin(n, p, recv_k);
    c.exchange(buf + sb, ring_end(n, p, send_k) - sb, right, buf + rb, ring_end(n, p, recv_k) - rb,
               left);
  }
}

int unfold_rank(int newrank, int rem) {
  return newrank < rem ? 2 * newrank + 1 : newrank + rem;
}

// Runs a power-of-two algorithm body(me, p2, rem) on any group size: among the first 2r ranks
// (r = p - p2, p2 = 2^floor(log2 p)) the even ones hand their data to their odd neighbour and
// sit out of the body (me = rank in the folded group); afterwards they get the result back.
template <class Body>
void on_power_of_two(float* buf, std::size_t n, const ReduceComm& c, CountedVector<float>& tmp,
                     Body&& body) {
  if (c.size == 1 || n == 0) return;
  grow_scratch(tmp, n);
  int p2 = 1;
  while (p2 * 2 <= c.size) p2 *= 2;
  const int rem = c.size - p2;
  const bool paired = c.rank < 2 * rem, sits_out = paired && c.rank % 2 == 0;
  if (sits_out) {
    c.send(buf, n, c.rank + 1);
  } else if (paired) {
    c.recv(tmp.data(), n, c.rank - 1);
    add(buf, tmp.data(), n);
  }
  if (!sits_out) body(paired ? c.rank / 2 : c.rank - rem, p2, rem);
  if (sits_out) {
    c.recv(buf, n, c.rank + 1);
  } else if (paired) {
    c.send(buf, n, c.rank - 1);
  }
}

} // namespace

ReduceComm::ReduceComm(MPI_Comm comm_, const Watchdog& watchdog_, const std::string& what_)
    : comm(comm_), watchdog(watchdog_), what(what_) {
  if (comm != MPI_COMM_NULL) {
    PT_MPI(MPI_Comm_rank(comm, &rank));
    PT_MPI(MPI_Comm_size(comm, &size));
  }
}

void ReduceComm::exchange(const float* send_buf, std::size_t ns, int to, float* recv_buf,
                          std::size_t nr, int from) const {
  MPI_Request r[2];
  PT_MPI(MPI_Irecv(recv_buf, as_count(nr), MPI_FLOAT, from, kTag, comm, &r[0]));
  PT_MPI(MPI_Isend(send_buf, as_count(ns), MPI_FLOAT, to, kTag, comm, &r[1]));
  watchdog.wait(r[0], what);
  watchdog.wait(r[1], what);
}

void ReduceComm::send(const float* x, std::size_t n, int to) const {
  MPI_Request r;
  PT_MPI(MPI_Isend(x, as_count(n), MPI_FLOAT, to, kTag, comm, &r));
  watchdog.wait(r, what);
}

void ReduceComm::recv(float* x, std::size_t n, int from) const {
  MPI_Request r;
  PT_MPI(MPI_Irecv(x, as_count(n), MPI_FLOAT, from, kTag, comm, &r));
  watchdog.wait(r, what);
}

void ReduceComm::barrier() const {
  watchdog.barrier(comm, what);
}

void ring_allreduce(float* buf, std::size_t n, const ReduceComm& c, CountedVector<float>& tmp) {
  if (c.size == 1 || n == 0) return;
  ring_reduce_scatter(buf, n, c, tmp);
  ring_all_gather(buf, n, c);
}

void recursive_doubling_allreduce(float* buf, std::size_t n, const ReduceComm& c,
                                  CountedVector<float>& tmp) {
  on_power_of_two(buf, n, c, tmp, [&](int me, int p2, int rem) {
    for (int mask = 1; mask < p2; mask <<= 1) {
      const int partner = unfold_rank(me ^ mask, rem);
      c.exchange(buf, n, partner, tmp.data(), n, partner);
      // the same operand order on both sides keeps the two copies bit-identical
      if ((me & mask) == 0) {
        add(buf, tmp.data(), n);
      } else {
        for (std::size_t i = 0; i < n; ++i) buf[i] = tmp[i] + buf[i];
      }
    }
  });
}

// Reduce-scatter by recursive halving, all-gather by recursive doubling.
void rabenseifner_allreduce(float* buf, std::size_t n, const ReduceComm& c,
                            CountedVector<float>& tmp) {
  on_power_of_two(buf, n, c, tmp, [&](int me, int p2, int rem) {
    int lo = 0, hi = p2; // my chunk range [lo, hi) of p2 chunks
    for (int mask = p2 / 2; mask >= 1; mask >>= 1) {
      const int partner = unfold_rank(me ^ mask, rem);
      const int mid = (lo + hi) / 2;
      const bool keep_low = (me & mask) == 0;
      const int klo = keep_low ? lo : mid, khi = keep_low ? mid : hi;
      const int slo = keep_low ? mid : lo, shi = keep_low ? hi : mid;
      const std::size_t kb = chunk_begin(n, p2, klo), ke = chunk_begin(n, p2, khi);
      const std::size_t sb = chunk_begin(n, p2, slo), se = chunk_begin(n, p2, shi);
      c.exchange(buf + sb, se - sb, partner, tmp.data(), ke - kb, partner);
      add(buf + kb, tmp.data(), ke - kb);
      lo = klo;
      hi = khi;
    }
    for (int mask = 1; mask < p2; mask <<= 1) {
      const int partner = unfold_rank(me ^ mask, rem);
      const bool low = (me & mask) == 0; // my range is the lower half of the merged range
      const int width = hi - lo;
      const int olo = low ? hi : lo - width, ohi = low ? hi + width : lo;
      const std::size_t mb = chunk_begin(n, p2, lo), me_end = chunk_begin(n, p2, hi);
      const std::size_t ob = chunk_begin(n, p2, olo), oe = chunk_begin(n, p2, ohi);
      c.exchange(buf + mb, me_end - mb, partner, buf + ob, oe - ob, partner);
      lo = low ? lo : olo;
      hi = low ? ohi : hi;
    }
  });
}

// Pairwise exchanges: in step s rank r sends to r+s and receives from r-s (mod p).
void reduce_scatter_blocks(const float* in, float* out, std::size_t each, const ReduceComm& c,
                           CountedVector<float>& tmp) {
  const int p = c.size, r = c.rank;
  const auto block = [each](int k) { return static_cast<std::size_t>(k) * each; };
  grow_scratch(tmp, block(p));
  std::copy(in + block(r), in + block(r + 1), tmp.begin() + static_cast<std::ptrdiff_t>(block(r)));
  for (int s = 1; s < p; ++s) {
    const int to = (r + s) % p, from = (r + p - s) % p;
    c.exchange(in + block(to), each, to, tmp.data() + block(from), each, from);
  }
  std::copy(tmp.begin(), tmp.begin() + static_cast<std::ptrdiff_t>(each), out);
  for (int k = 1; k < p; ++k) add(out, tmp.data() + block(k), each);
}

void all_gather_blocks(const float* mine, float* out, std::size_t each, const ReduceComm& c) {
  const int p = c.size, r = c.rank;
  const auto block = [each](int k) { return static_cast<std::size_t>(k) * each; };
  if (mine != out + block(r)) std::copy(mine, mine + each, out + block(r));
  for (int s = 1; s < p; ++s) {
    const int to = (r + s) % p, from = (r + p - s) % p;
    c.exchange(mine, each, to, out + block(from), each, from);
  }
}

// Two levels over rows of c consecutive ranks and the columns across them. When a row's ranks
// share memory (hierarchical's node), the row steps go through a shared window: each rank's
// part holds up to one segment.
struct Allreducer::TwoLevel {
  MPI_Comm row = MPI_COMM_NULL, col = MPI_COMM_NULL;
  bool shared = false; // the row's ranks share memory and step through the window
  MPI_Win win = MPI_WIN_NULL;
  std::size_t win_floats = 0; // per rank
  std::vector<float*> part;   // every row rank's part of the window
  CountedVector<float> tmp;   // the column step's scratch
};

Allreducer::Allreducer(MPI_Comm comm, AllreduceOptions opt)
    : comm_(comm), opt_(std::move(opt)), all_(comm, *opt_.watchdog, opt_.what) {
  rank_ = all_.rank;
  size_ = all_.size;
}

Allreducer::~Allreducer() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (auto& [c, g] : groups_) {
    if (finalized == 0) { // nothing to free after MPI_Finalize (the contract: before)
      if (g->win != MPI_WIN_NULL) {
        MPI_Win_unlock_all(g->win);
        MPI_Win_free(&g->win);
      }
      if (g->row != MPI_COMM_NULL) MPI_Comm_free(&g->row);
      if (g->col != MPI_COMM_NULL) MPI_Comm_free(&g->col);
    }
    delete g;
  }
}

AllreduceAlgo Allreducer::algorithm_for(std::size_t n) const {
  if (opt_.algo) return *opt_.algo;
  if (auto it = measured_.find(n); it != measured_.end()) return it->second.pick;
  return choose_algorithm(static_cast<double>(n) * sizeof(float), size_, opt_.node_size,
                          opt_.topology);
}

Allreducer::TwoLevel& Allreducer::two_level_groups(int c) {
  auto it = groups_.find(c);
  if (it != groups_.end()) return *it->second;
  auto* g = new TwoLevel;
  groups_[c] = g;
  PT_MPI(MPI_Comm_split(comm_, rank_ / c, rank_, &g->row));
  PT_MPI(MPI_Comm_split(comm_, rank_ % c, rank_, &g->col));
  // only hierarchical's rows (its nodes) step through a window
  const bool node_rows = c == two_level_row(AllreduceAlgo::hierarchical, size_, opt_.node_size);
  if (opt_.shared_memory && node_rows) {
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
// kWindowSegmentFloats floats. Rank k owns chunk k: it copies every other chunk of its data into
// its part of the window, sums chunk k over all ranks in rank order (its own data read in place,
// the same operands and order wherever it is computed), all-reduces it across the column, and
// leaves it in its part of the window; every rank then copies the other chunks out of their
// owners' parts. Each rank writes only its own part, and no chunk is copied in and out by its
// owner. Plain (cached) stores: streaming stores past the caches were faster only where a VM
// placed the two cores far apart (docs/collectives.md).
void Allreducer::window_step(float* buf, std::size_t n, TwoLevel& g) {
  const ReduceComm row(g.row, *opt_.watchdog, opt_.what), col(g.col, *opt_.watchdog, opt_.what);
  const std::size_t want = std::min(n, kWindowSegmentFloats);
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
    g.part.assign(static_cast<std::size_t>(row.size), nullptr);
    for (int r = 0; r < row.size; ++r) {
      MPI_Aint bytes = 0;
      int unit = 0;
      PT_MPI(MPI_Win_shared_query(g.win, r, &bytes, &unit, &g.part[static_cast<std::size_t>(r)]));
    }
    PT_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, g.win));
    g.win_floats = want;
    // map this rank's pages now, not inside a timed step
    std::memset(g.part[static_cast<std::size_t>(row.rank)], 0, want * sizeof(float));
  }
  auto sync = [&] { // make every rank's stores visible to the others
    PT_MPI(MPI_Win_sync(g.win));
    row.barrier();
    PT_MPI(MPI_Win_sync(g.win));
  };
  const int q = row.size, me = row.rank;
  float* mine = g.part[static_cast<std::size_t>(me)];
  for (std::size_t off = 0; off < n; off += want) {
    const std::size_t w = std::min(want, n - off);
    float* seg = buf + off;
    const std::size_t b = chunk_begin(w, q, me), e = chunk_begin(w, q, me + 1);
    std::memcpy(mine, seg, b * sizeof(float));
    std::memcpy(mine + e, seg + e, (w - e) * sizeof(float));
    sync();
    auto part = [&](int r) { return r == me ? seg + b : g.part[static_cast<std::size_t>(r)] + b; };
    // one pass per added rank, in rank order, into this rank's part of the window
    float* out = mine + b;
    std::memcpy(out, part(0), (e - b) * sizeof(float));
    for (int r = 1; r < q; ++r) {
      const float* x = part(r);
      for (std::size_t i = 0; i < e - b; ++i) out[i] += x[i];
    }
    if (col.size > 1) rabenseifner_allreduce(out, e - b, col, g.tmp);
    std::memcpy(seg + b, out, (e - b) * sizeof(float));
    sync();
    for (int r = 0; r < q; ++r) {
      if (r == me) continue;
      const std::size_t rb = chunk_begin(w, q, r), re = chunk_begin(w, q, r + 1);
      std::memcpy(seg + rb, g.part[static_cast<std::size_t>(r)] + rb, (re - rb) * sizeof(float));
    }
    sync(); // nobody overwrites the window before everyone has read it
  }
}

// Reduce-scatter inside rows of c consecutive ranks (ring, or the shared window), all-reduce of
// each owned chunk down the column (among ranks at the same position, Rabenseifner), all-gather
// inside the row. hierarchical: the rows are nodes (node_local: through the window when they
// share memory); torus2d: the rows of a near-square grid, always by messages.
void Allreducer::two_level(float* buf, std::size_t n, int c, bool node_local) {
  if (c == 0) { // no two levels on this communicator (two_level_row)
    rabenseifner_allreduce(buf, n, all_, tmp_);
    return;
  }
  TwoLevel& g = two_level_groups(c);
  if (node_local && g.shared) {
    used_shm_ = true;
    window_step(buf, n, g);
    return;
  }
  const ReduceComm row(g.row, *opt_.watchdog, opt_.what), col(g.col, *opt_.watchdog, opt_.what);
  const int owned = ring_reduce_scatter(buf, n, row, tmp_);
  const std::size_t ob = ring_begin(n, row.size, owned);
  if (col.size > 1) rabenseifner_allreduce(buf + ob, ring_end(n, row.size, owned) - ob, col, tmp_);
  ring_all_gather(buf, n, row);
}

void Allreducer::run(AllreduceAlgo algo, float* buf, std::size_t n) {
  if (algo != AllreduceAlgo::mpi) opt_.watchdog->count_collective(); // mpi counts itself
  switch (algo) {
  case AllreduceAlgo::mpi:
    opt_.watchdog->allreduce(buf, as_count(n), MPI_FLOAT, MPI_SUM, comm_, opt_.what);
    return;
  case AllreduceAlgo::ring:
    return ring_allreduce(buf, n, all_, tmp_);
  case AllreduceAlgo::recursive_doubling:
    return recursive_doubling_allreduce(buf, n, all_, tmp_);
  case AllreduceAlgo::rabenseifner:
    return rabenseifner_allreduce(buf, n, all_, tmp_);
  case AllreduceAlgo::hierarchical:
  case AllreduceAlgo::torus2d:
    return two_level(buf, n, two_level_row(algo, size_, opt_.node_size),
                     algo == AllreduceAlgo::hierarchical);
  }
}

// The algorithms that run differently on this communicator: the two-level ones where they have
// two levels (two_level_row), except hierarchical on one node reached by messages (a ring).
std::vector<AllreduceAlgo> Allreducer::candidates() {
  std::vector<AllreduceAlgo> out = {AllreduceAlgo::mpi, AllreduceAlgo::ring,
                                    AllreduceAlgo::recursive_doubling, AllreduceAlgo::rabenseifner};
  const int g = two_level_row(AllreduceAlgo::hierarchical, size_, opt_.node_size);
  if (g > 0 && (g < size_ || two_level_groups(g).shared)) {
    out.push_back(AllreduceAlgo::hierarchical);
  }
  if (two_level_row(AllreduceAlgo::torus2d, size_, 0) > 0) out.push_back(AllreduceAlgo::torus2d);
  return out;
}

// auto's one measurement of a size, on its first call (the approach of STAR-MPI: Faraj, Yuan &
// Lowenthal, ICS 2006, cut to a single round): every candidate runs twice on a copy of the
// bucket, each call between barriers; the faster of its two calls counts (the first also makes
// windows, sub-communicators and scratch), and the slowest rank's time decides, so every rank
// picks alike. The bucket itself is then summed by the pick, which stays for the run.
void Allreducer::measure(float* buf, std::size_t n) {
  AutoChoice choice;
  choice.model = algorithm_for(n);
  const std::vector<AllreduceAlgo> cand = candidates();
  saved_.assign(buf, buf + n);
  std::vector<double> best(cand.size(), 1e30);
  for (int rep = 0; rep < 2; ++rep) {
    for (std::size_t k = 0; k < cand.size(); ++k) {
      std::copy(saved_.begin(), saved_.end(), buf);
      all_.barrier();
      const double t0 = wall_time();
      run(cand[k], buf, n);
      best[k] = std::min(best[k], wall_time() - t0);
    }
  }
  opt_.watchdog->allreduce(best.data(), as_count(best.size()), MPI_DOUBLE, MPI_MAX, comm_,
                           opt_.what + " (auto's measurement)");
  for (std::size_t k = 0; k < cand.size(); ++k) choice.seconds.emplace_back(cand[k], best[k]);
  choice.pick = auto_pick(choice.seconds, choice.model);
  std::copy(saved_.begin(), saved_.end(), buf);
  saved_.clear();
  saved_.shrink_to_fit();
  run(choice.pick, buf, n);
  measured_[n] = std::move(choice);
}

void Allreducer::sum(float* buf, std::size_t n) {
  if (size_ == 1 || n == 0) return;
  if (!opt_.algo && opt_.autotune && measured_.count(n) == 0) return measure(buf, n);
  run(algorithm_for(n), buf, n);
}

} // namespace pt
