#include "comm/allreduce.hpp"

#include <stdexcept>
#include <vector>

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

// Two levels: reduce-scatter inside groups of g consecutive ranks (ring), all-reduce of each
// owned chunk across the groups (among ranks with the same position, rabenseifner), all-gather
// inside the group. hierarchical: the groups are nodes; torus2d: the rows of a near-square grid.
void two_level(float* buf, std::size_t n, const Comm& cm, int g, std::vector<float>& tmp) {
  if (g <= 1 || g >= cm.size || cm.size % g != 0) {
    rabenseifner(buf, n, cm, tmp);
    return;
  }
  MPI_Comm row, col;
  PT_MPI(MPI_Comm_split(cm.c, cm.rank / g, cm.rank, &row));
  PT_MPI(MPI_Comm_split(cm.c, cm.rank % g, cm.rank, &col));
  const Comm r(row), c(col);
  // reduce-scatter in the row, all-reduce each owned chunk down the column, all-gather the row
  const int owned = ring_reduce_scatter(buf, n, r, tmp);
  const std::size_t ob = ring_begin(n, r.size, owned);
  rabenseifner(buf + ob, ring_end(n, r.size, owned) - ob, c, tmp);
  ring_all_gather(buf, n, r);
  MPI_Comm_free(&row);
  MPI_Comm_free(&col);
}

} // namespace

AllreduceAlgo allreduce_algo(const std::string& name) {
  if (name == "mpi" || name == "auto") return AllreduceAlgo::mpi;
  if (name == "ring") return AllreduceAlgo::ring;
  if (name == "recursive-doubling") return AllreduceAlgo::recursive_doubling;
  if (name == "rabenseifner") return AllreduceAlgo::rabenseifner;
  if (name == "hierarchical") return AllreduceAlgo::hierarchical;
  if (name == "torus2d") return AllreduceAlgo::torus2d;
  throw std::invalid_argument("unknown all-reduce algorithm \"" + name + "\"");
}

void allreduce_sum(float* buf, std::size_t n, MPI_Comm comm, AllreduceAlgo algo, int node_size,
                   std::vector<float>* scratch) {
  const Comm cm(comm);
  std::vector<float> local;
  std::vector<float>& tmp = scratch != nullptr ? *scratch : local;
  switch (algo) {
  case AllreduceAlgo::mpi:
    if (n > 0) {
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm));
    }
    return;
  case AllreduceAlgo::ring:
    return ring(buf, n, cm, tmp);
  case AllreduceAlgo::recursive_doubling:
    return recursive_doubling(buf, n, cm, tmp);
  case AllreduceAlgo::rabenseifner:
    return rabenseifner(buf, n, cm, tmp);
  case AllreduceAlgo::hierarchical:
    return two_level(buf, n, cm, node_size, tmp);
  case AllreduceAlgo::torus2d: {
    int rows = 1;
    for (int d = 1; d * d <= cm.size; ++d) {
      if (cm.size % d == 0) rows = d;
    }
    return two_level(buf, n, cm, cm.size / rows, tmp);
  }
  }
}

} // namespace pt
