#include "comm/allreduce.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

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

// out = a + b, stored to also as well unless it is null; out and also may each be a or b (the
// same element is read before it is written).
void add_to(float* out, float* also, const float* a, const float* b, std::size_t n) {
  if (also == nullptr) {
    for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float s = a[i] + b[i];
    out[i] = s;
    also[i] = s;
  }
}

// Streaming stores (past the caches, as whole lines to memory) where the CPU has them, else
// plain ones; the fence orders them before the barrier that publishes them to the other ranks.
void stream_copy(float* dst, const float* src, std::size_t n) {
  std::size_t i = 0;
#if defined(__SSE2__)
  for (; i < n && (reinterpret_cast<std::uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
  for (; i < n; ++i) dst[i] = src[i];
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// add_to with streaming stores to out (also, private memory, gets plain ones).
void stream_add_to(float* out, float* also, const float* a, const float* b, std::size_t n) {
  std::size_t i = 0;
  auto one = [&](std::size_t k) {
    const float s = a[k] + b[k];
    out[k] = s;
    if (also != nullptr) also[k] = s;
  };
#if defined(__SSE2__)
  for (; i < n && (reinterpret_cast<std::uintptr_t>(out + i) & 15) != 0; ++i) one(i);
  for (; i + 4 <= n; i += 4) {
    const __m128 s = _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i));
    _mm_stream_ps(out + i, s);
    if (also != nullptr) _mm_storeu_ps(also + i, s);
  }
#endif
  for (; i < n; ++i) one(i);
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// How often to try something measured slower than what runs: every 16th time, doubled (up to
// cap) while `tries` runs of it, at `other` against `mine` seconds, would cost more than 2% of
// the time in between. Unmeasured (0): every 16th.
std::uint64_t try_period(double mine, double other, double tries, std::uint64_t cap) {
  std::uint64_t period = 16;
  if (mine <= 0.0 || other <= 0.0) return period;
  while (period < cap && tries * (other - mine) > 0.02 * mine * static_cast<double>(period)) {
    period *= 2;
  }
  return period;
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

} // namespace

namespace {

// The calls mean_of_fastest and error_of_fastest keep: all but the slowest size/drop_one_in, at
// least one (none of none).
std::vector<double> fastest_kept(std::vector<double> seconds, std::size_t drop_one_in) {
  std::sort(seconds.begin(), seconds.end());
  if (!seconds.empty()) {
    seconds.resize(std::max<std::size_t>(1, seconds.size() - seconds.size() / drop_one_in));
  }
  return seconds;
}

double mean_of(const std::vector<double>& x) {
  double s = 0.0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

} // namespace

double mean_of_fastest(std::vector<double> seconds, std::size_t drop_one_in) {
  if (seconds.empty()) return 1e30; // nothing measured: never the faster one
  return mean_of(fastest_kept(std::move(seconds), drop_one_in));
}

double error_of_fastest(std::vector<double> seconds, std::size_t drop_one_in) {
  const std::vector<double> kept = fastest_kept(std::move(seconds), drop_one_in);
  if (kept.size() < 2) return 0.0;
  const double mean = mean_of(kept);
  double ss = 0.0;
  for (double v : kept) ss += (v - mean) * (v - mean);
  const auto k = static_cast<double>(kept.size());
  return std::sqrt(ss / (k - 1.0) / k);
}

std::optional<AllreduceAlgo> parse_allreduce(const std::string& name) {
  if (name == "auto") return std::nullopt;
  for (AllreduceAlgo a :
       {AllreduceAlgo::mpi, AllreduceAlgo::ring, AllreduceAlgo::recursive_doubling,
        AllreduceAlgo::rabenseifner, AllreduceAlgo::hierarchical, AllreduceAlgo::torus2d}) {
    if (name == algorithm_name(a)) return a;
  }
  throw std::invalid_argument("unknown all-reduce algorithm \"" + name + "\"");
}

namespace {

// A rank's mailbox at the end of its part of the window: its store chooser's times after the
// segment it learned last (own), which one that was (seq: segments learned so far) and whether
// a try ended there, and its chooser's count of segments then (a forget since makes it stale).
// 16 floats, after the data rounded up to 16 floats.
struct Mail {
  double own[2] = {0.0, 0.0};
  double seq = 0.0;
  double ended = 0.0;
  double timed = 0.0; // the chooser's segments_timed() then
};
constexpr std::size_t kMailFloats = 16;
static_assert(sizeof(Mail) <= kMailFloats * sizeof(float));

std::size_t mail_offset(std::size_t floats) {
  return (floats + kMailFloats - 1) / kMailFloats * kMailFloats;
}

} // namespace

// A node group's shared window (WindowPool) and what is learned of it. Each rank's part ends
// in a mailbox: its chooser's times after its last learned segment.
struct WindowPool::Window {
  MPI_Comm row = MPI_COMM_NULL; // a duplicate of the first user's row: the window's group
  MPI_Win win = MPI_WIN_NULL;
  std::size_t win_floats = 0; // per rank
  std::vector<float*> slot;   // every row rank's part of the window
  // adaptive window stores per segment size class (2^11 floats and up, doubling); a class
  // seen for the first time starts from the class timed last (StoreChooser::seed)
  std::array<StoreChooser, 8> choice;
  StoreChooser* last = nullptr; // the chooser of the segment size timed last
  std::uint64_t learned = 0;    // segments learned from, on every rank alike
  std::uint64_t agreed = 0;     // the last of them whose times the ranks agreed on
  Mail* mail(int r) const {
    return reinterpret_cast<Mail*>(slot[static_cast<std::size_t>(r)] + mail_offset(win_floats));
  }
  Mail posted; // this rank's last mail, posted again into a regrown window
  // the segment length per message size class (std::bit_width of the floats), from the first
  // message of the class longer than a short segment
  std::map<int, SegmentChooser> segments;
  SegmentChooser* segment_chooser(std::size_t n) {
    return n > SegmentChooser::kShort ? &segments[std::bit_width(n)] : nullptr;
  }
  // the chooser of n floats' class if a message of it has come; none made
  const SegmentChooser* segment_chooser_seen(std::size_t n) const {
    const auto it = segments.find(std::bit_width(n));
    return it == segments.end() ? nullptr : &it->second;
  }
  // the length that n floats run with now (a held call's: the long one while choosing)
  std::size_t segment_now(std::size_t n) const {
    const SegmentChooser* c = segment_chooser_seen(n);
    return std::min(n, c == nullptr ? SegmentChooser::kLong : c->next(true));
  }
};

WindowPool::WindowPool() = default;

WindowPool::~WindowPool() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) return; // nothing to free after MPI_Finalize (the contract: before)
  for (auto& w : windows_) {
    if (w->win != MPI_WIN_NULL) {
      MPI_Win_unlock_all(w->win);
      MPI_Win_free(&w->win);
    }
    MPI_Comm_free(&w->row);
  }
}

WindowPool::Window& WindowPool::window_of(MPI_Comm row) {
  for (auto& w : windows_) {
    int same = MPI_UNEQUAL;
    PT_MPI(MPI_Comm_compare(w->row, row, &same));
    if (same == MPI_IDENT || same == MPI_CONGRUENT) return *w;
  }
  auto w = std::make_unique<Window>();
  PT_MPI(MPI_Comm_dup(row, &w->row));
  windows_.push_back(std::move(w));
  return *windows_.back();
}

// Two levels over rows of c consecutive ranks and the columns across them. When a row's ranks
// share memory (hierarchical's node), the row steps go through a shared window of the pool.
struct Allreducer::Groups {
  MPI_Comm row = MPI_COMM_NULL, col = MPI_COMM_NULL;
  bool shared = false;                  // the row's ranks share memory
  WindowPool::Window* window = nullptr; // the pool's, from the first window step
  WindowStepTimes times;                // this Allreducer's segments with a chooser
};

struct Allreducer::Trial {
  std::vector<AllreduceAlgo> cand;
  std::vector<char> alive;
  std::vector<std::vector<double>> calls; // seconds, timed rounds
  std::vector<double> at_drop;            // agreed fastest call of each, at the last drop check
  int round = 0;                          // timed rounds done
  int rounds = 3;                         // timed rounds
  std::size_t next = 0;                   // candidate of the next call
  bool warm = false;                      // its untimed call has run
  int cold = 0;                           // untimed calls of the window step for its store times
  int switches = 0, remeasures = 0;       // carried from the watch of an earlier measurement
  std::optional<AllreduceAlgo> replaced;  // a re-measurement: the pick it replaces
};

Allreducer::Allreducer(MPI_Comm comm, AllreduceOptions opt)
    : comm_(comm), opt_(std::move(opt)),
      pool_(opt_.windows ? opt_.windows : std::make_shared<WindowPool>()) {
  PT_MPI(MPI_Comm_rank(comm_, &rank_));
  PT_MPI(MPI_Comm_size(comm_, &size_));
}

Allreducer::~Allreducer() {
  for (auto& [c, g] : groups_) {
    if (g->row != MPI_COMM_NULL) MPI_Comm_free(&g->row);
    if (g->col != MPI_COMM_NULL) MPI_Comm_free(&g->col);
    delete g;
  }
}

AllreduceAlgo Allreducer::algorithm_for(std::size_t n) const {
  if (opt_.algo) return *opt_.algo;
  if (auto it = tuned_.find(n); it != tuned_.end()) return it->second.pick;
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
    // only hierarchical's rows (its nodes) step through a window: a torus2d row that happens
    // to share memory gets none, nor the pool's communicator for it
    const bool node_rows = c == two_level_row(AllreduceAlgo::hierarchical, size_, opt_.node_size);
    if (g->shared && node_rows) g->window = &pool_->window_of(g->row); // memory at the first step
  }
  return *g;
}

namespace {

void plain_copy(float* dst, const float* src, std::size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

constexpr std::size_t kTimedSegmentFloats = 2048; // smaller segments: cached stores, untimed

// The chooser of segments of w floats, or none: stores fixed by the options, or segments too
// short to time (cached stores).
StoreChooser* store_chooser(WindowStores mode, std::array<StoreChooser, 8>& choice, std::size_t w) {
  if (mode != WindowStores::adaptive || w < kTimedSegmentFloats) return nullptr;
  return &choice[std::min<std::size_t>(std::bit_width(w / kTimedSegmentFloats) - 1,
                                       choice.size() - 1)];
}

} // namespace

int StoreChooser::next(bool hold) const {
  if (hold) return kind_;           // a try waits, or goes on, after the held segments
  if (tried_ > 0) return 1 - kind_; // a try in progress: three segments in a row
  if (timed_ >= 1 && own_[1 - kind_] == 0.0) return 1 - kind_; // the first try, early
  const std::uint64_t period = try_period(per_float_[kind_], per_float_[1 - kind_], kTrial, 512);
  return timed_ % period >= period - kTrial ? 1 - kind_ : kind_;
}

void StoreChooser::seed(const StoreChooser& last) {
  if (timed_ != 0 || &last == this) return;
  kind_ = last.kind_;
}

std::size_t SegmentChooser::next(bool hold) const {
  if (pick_ != 0) return pick_;
  if (hold) return kLong;
  return long_.size() <= short_.size() ? kLong : kShort; // alternate, long first
}

bool SegmentChooser::learn(std::size_t len, double seconds_per_float) {
  if (pick_ != 0) return false;
  (len == kLong ? long_ : short_).push_back(seconds_per_float);
  return static_cast<int>(long_.size()) >= kCalls && static_cast<int>(short_.size()) >= kCalls;
}

std::pair<double, double> SegmentChooser::medians() const {
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  return {median(long_), median(short_)};
}

void SegmentChooser::agree(double long_spf, double short_spf) {
  pick_ = short_spf > 0.0 && short_spf < long_spf * (1.0 - kMargin) ? kShort : kLong;
}

void StoreChooser::forget() {
  per_float_[0] = per_float_[1] = 0.0;
  own_[0] = own_[1] = 0.0;
  timed_ = 0;
  tried_ = 0;
}

bool StoreChooser::learn(int kind, double seconds_per_float) {
  ++timed_;
  if (kind == kind_) {
    double& t = own_[kind];
    t = t > 0.0 ? 0.7 * t + 0.3 * seconds_per_float : seconds_per_float;
    return false;
  }
  trial_[tried_++] = seconds_per_float;
  if (tried_ < kTrial) return false;
  tried_ = 0;
  std::sort(trial_, trial_ + kTrial);
  own_[kind] = trial_[kTrial / 2];
  return true;
}

void StoreChooser::agree(double cached, double streaming, bool try_ended, std::uint64_t timed) {
  if (timed != timed_) return; // posted before a forget
  per_float_[0] = cached;
  per_float_[1] = streaming;
  const int other = 1 - kind_;
  if (try_ended && per_float_[other] > 0.0 && per_float_[other] < per_float_[kind_]) {
    kind_ = other;
  }
}

// Node-local reduce-scatter and all-gather through the shared window, per segment of at most
// kWindowSegmentFloats floats. Rank k owns chunk k: it copies every other chunk of its data into
// its part of the window, sums chunk k over all ranks in rank order (its own data read in place,
// the same operands and order wherever it is computed), all-reduces it across the column, and
// leaves it in its part of the window; every rank then copies the other chunks out of their owners'
// parts. Each rank writes only its own part, and no chunk is copied in and out by its owner: on
// two ranks this moved a quarter fewer bytes across cores than funnelling every result through
// rank 0's part, whose copy-in then ran 3-4x slower than the other rank's (docs/collectives.md).
void Allreducer::shm_two_level(float* buf, std::size_t n, Groups& g) {
  const Comm row(g.row), col(g.col);
  WindowPool::Window& win = *g.window;
  SegmentChooser* const lengths = win.segment_chooser(n);
  const std::size_t len = lengths != nullptr ? lengths->next(hold_tries_) : SegmentChooser::kLong;
  // a call the segment chooser learns from (not a held one, nor after the pick)
  const bool choosing = lengths != nullptr && !hold_tries_ && lengths->pick() == 0;
  const auto start =
      choosing ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  const std::size_t want = std::min(n, len);
  const bool grown = win.win_floats < want;
  if (grown) { // every row rank asks for the same size: a collective regrowth
    if (win.win != MPI_WIN_NULL) {
      PT_MPI(MPI_Win_unlock_all(win.win));
      PT_MPI(MPI_Win_free(&win.win));
    }
    MPI_Info info;
    PT_MPI(MPI_Info_create(&info));
    PT_MPI(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
    float* base = nullptr;
    const std::size_t part_floats = mail_offset(want) + kMailFloats;
    PT_MPI(MPI_Win_allocate_shared(static_cast<MPI_Aint>(part_floats * sizeof(float)),
                                   sizeof(float), info, win.row, &base, &win.win));
    PT_MPI(MPI_Info_free(&info));
    win.slot.assign(static_cast<std::size_t>(row.size), nullptr);
    for (int r = 0; r < row.size; ++r) {
      MPI_Aint bytes = 0;
      int unit = 0;
      PT_MPI(
          MPI_Win_shared_query(win.win, r, &bytes, &unit, &win.slot[static_cast<std::size_t>(r)]));
    }
    PT_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win.win));
    win.win_floats = want;
    // map every page now, each rank its own part by writing it and the others' by reading
    // them, so that no page fault is charged to a timed step (or to the store chooser)
    std::memset(win.slot[static_cast<std::size_t>(row.rank)], 0, part_floats * sizeof(float));
    *win.mail(row.rank) = win.posted;
    PT_MPI(MPI_Win_sync(win.win));
    PT_MPI(MPI_Barrier(win.row));
    PT_MPI(MPI_Win_sync(win.win));
    float touched = 0.0f;
    for (int r = 0; r < row.size; ++r) {
      const float* part = win.slot[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < want; i += 1024) touched += part[i]; // one per 4 KiB page
    }
    volatile float sink = touched;
    (void)sink;
  }
  auto sync = [&] { // make every rank's stores visible to the others
    PT_MPI(MPI_Win_sync(win.win));
    PT_MPI(MPI_Barrier(win.row));
    PT_MPI(MPI_Win_sync(win.win));
  };
  const int q = row.size, me = row.rank;
  float* mine = win.slot[static_cast<std::size_t>(me)];
  for (std::size_t off = 0; off < n; off += want) {
    const std::size_t w = std::min(want, n - off);
    float* seg = buf + off;
    const std::size_t b = chunk_begin(w, q, me), e = chunk_begin(w, q, me + 1);
    // the kind of stores into the window (0 cached, 1 streaming): fixed, or adaptive: the
    // chooser of this segment size picks it and times the step (segments too short to time:
    // cached, no chooser)
    StoreChooser* const chooser = store_chooser(opt_.window_stores, win.choice, w);
    int stores = opt_.window_stores == WindowStores::streaming ? 1 : 0;
    if (chooser != nullptr) {
      if (win.last != nullptr) chooser->seed(*win.last);
      stores = chooser->next(hold_tries_);
    }
    using Clock = std::chrono::steady_clock;
    auto now = [&] { return chooser != nullptr ? Clock::now() : Clock::time_point{}; };
    const auto t0 = now();
    auto copy_in = stores == 1 ? stream_copy : plain_copy;
    copy_in(mine, seg, b);
    copy_in(mine + e, seg + e, w - e);
    const auto t1 = now();
    sync();
    const auto t2 = now(); // the wait for the slower rank not counted
    agree_stores(win, q);
    auto part = [&](int r) {
      return r == me ? seg + b : win.slot[static_cast<std::size_t>(r)] + b;
    };
    // one pass per added rank; without a column step the last pass also writes the result out
    float* out = mine + b;
    float* last = col.size > 1 ? nullptr : seg + b;
    if (q == 1) std::memcpy(out, part(0), (e - b) * sizeof(float));
    for (int r = 1; r < q; ++r) {
      auto pass = r == q - 1 && stores == 1 ? stream_add_to : add_to;
      pass(out, r == q - 1 ? last : nullptr, r == 1 ? part(0) : out, part(r), e - b);
    }
    if (col.size > 1) {
      rabenseifner(out, e - b, col, tmp2_);
      std::memcpy(seg + b, out, (e - b) * sizeof(float));
    }
    sync();
    for (int r = 0; r < q; ++r) {
      if (r == me) continue;
      const std::size_t rb = chunk_begin(w, q, r), re = chunk_begin(w, q, r + 1);
      std::memcpy(seg + rb, win.slot[static_cast<std::size_t>(r)] + rb, (re - rb) * sizeof(float));
    }
    sync(); // nobody overwrites the window before everyone has read it
    // a first step after the window grew runs cold: not learned from
    if (chooser != nullptr && !grown) {
      const auto t3 = Clock::now();
      const std::chrono::duration<double> took = (t1 - t0) + (t3 - t2), wait = t2 - t1;
      const bool ended = chooser->learn(stores, took.count() / static_cast<double>(w));
      win.last = chooser;
      ++win.learned;
      // this rank's times, for every rank to read after the next segment's first sync
      win.posted = Mail{{chooser->own(0), chooser->own(1)},
                        static_cast<double>(win.learned),
                        ended ? 1.0 : 0.0,
                        static_cast<double>(chooser->segments_timed())};
      *win.mail(me) = win.posted;
      g.times.timed += took.count();
      g.times.wait += wait.count();
      ++g.times.segments;
    }
  }
  // the whole call, waits included, for the segment length (not a cold first call after the
  // window grew, nor a held one). Every rank of the communicator agrees, not only the window's:
  // the column step between nodes exchanges chunks of the segments, so all nodes' windows must
  // pick the same length (they count the same calls, in lockstep, and agree at the same one)
  if (choosing && !grown) {
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (lengths->learn(len, took.count() / static_cast<double>(n))) {
      const auto [mine_long, mine_short] = lengths->medians();
      double t[2] = {mine_long, mine_short};
      PT_MPI(MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, comm_));
      lengths->agree(t[0], t[1]);
    }
  }
}

// Every rank posted its mail before its first sync of this segment, and posts the next one only
// after the segment's last sync: all ranks read the same mail and agree alike. A rank's chooser
// steps in lockstep with the others' (the same segments learned, the same agreed times), so each
// mailbox holds the same seq; a regrown window holds the last mail posted again.
void Allreducer::agree_stores(WindowPool::Window& win, int q) {
  if (win.last == nullptr || win.agreed == win.learned) return;
  double t[2] = {0.0, 0.0};
  bool ended = false;
  for (int r = 0; r < q; ++r) {
    const Mail& m = *win.mail(r);
    if (m.seq != static_cast<double>(win.learned)) return; // a guard: equal in lockstep
    t[0] = std::max(t[0], m.own[0]);
    t[1] = std::max(t[1], m.own[1]);
    ended = ended || m.ended != 0.0;
  }
  win.agreed = win.learned;
  win.last->agree(t[0], t[1], ended, static_cast<std::uint64_t>(win.mail(0)->timed));
}

// Reduce-scatter inside rows of c consecutive ranks (ring, or the shared window), all-reduce of
// each owned chunk down the column (among ranks at the same position, Rabenseifner), all-gather
// inside the row. hierarchical: the rows are nodes (node_local: through the window when they
// share memory); torus2d: the rows of a near-square grid, always by messages.
void Allreducer::two_level(float* buf, std::size_t n, int c, bool node_local) {
  if (c == 0) { // no two levels on this communicator (two_level_row)
    rabenseifner(buf, n, Comm(comm_), tmp_);
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

void Allreducer::run(AllreduceAlgo algo, float* buf, std::size_t n) {
  const Comm cm(comm_);
  switch (algo) {
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
  case AllreduceAlgo::torus2d:
    return two_level(buf, n, two_level_row(algo, size_, opt_.node_size),
                     algo == AllreduceAlgo::hierarchical);
  }
}

void Allreducer::timed_run(AllreduceAlgo algo, float* buf, std::size_t n) {
  struct Release { // the hold ends with the call, however it ends
    bool& held;
    ~Release() { held = false; }
  } release{hold_tries_};
  hold_tries_ = true;
  run(algo, buf, n);
}

void Allreducer::sum(float* buf, std::size_t n) {
  if (quiet_ > 0 && n == watch_n_) { // auto's pick, untimed: as a fixed algorithm runs
    --quiet_;
    ++quiet_ran_;
    return run(quiet_pick_, buf, n);
  }
  if (size_ == 1 || n == 0) return;
  if (opt_.algo || !opt_.tune) return run(algorithm_for(n), buf, n);
  if (watch_ != nullptr) watch_->calls += quiet_ran_; // the short way's calls counted
  quiet_ran_ = quiet_ = 0;
  if (n != watch_n_) { // the trainer repeats a few bucket sizes: keep the last one's entry
    auto it = tuned_.find(n);
    if (it == tuned_.end()) return tuning_call(buf, n);
    watch_n_ = n;
    watch_ = &it->second;
  }
  watched_call(buf, n, *watch_);
}

WatchVerdict watch_verdict(double pick_ref, double pick_now, double challenger, int drifted_before,
                           int needed, double error) {
  if (pick_ref > 0.0 && (pick_now > 1.5 * pick_ref || pick_ref > 1.5 * pick_now)) {
    return drifted_before + 1 >= needed ? WatchVerdict::remeasure : WatchVerdict::drifted;
  }
  // the pick's better time of this window and the last one kept: one window of it stalled does
  // not let a challenger win
  const double pick = pick_ref > 0.0 ? std::min(pick_now, pick_ref) : pick_now;
  const bool faster = challenger < 0.97 * pick && pick - challenger > 2.0 * error;
  return faster ? WatchVerdict::challenger : WatchVerdict::keep;
}

std::size_t challenge_period(const TuneResult& w, const AllreduceAlgo* challenger) {
  double pick = 0.0, other = 0.0;
  for (const auto& [algo, sec] : w.seconds) {
    if (algo == w.pick) pick = sec;
    if (challenger != nullptr && algo == *challenger) other = sec;
  }
  if (w.pick_ref > 0.0) pick = w.pick_ref; // the pick's time now, not at the measurement
  return watch_period(pick, other);
}

std::size_t watch_period(double pick_s, double challenger_s) {
  constexpr double kWindowFloor = 100e-6; // seconds of the pick's calls per window, at least
  constexpr std::size_t kMax = 256;
  auto period = static_cast<std::size_t>(try_period(pick_s, challenger_s, 1.0, kMax));
  while (period < kMax && pick_s > 0.0 &&
         4.0 * static_cast<double>(period) * pick_s < kWindowFloor) {
    period *= 2;
  }
  return period;
}

WatchRole watch_role(std::size_t call, std::size_t period) {
  const std::size_t window = 4 * period, phase = call % period;
  if (call + 5 == window) return WatchRole::warm_challenger;
  if (call + 5 > window) return WatchRole::timed_challenger;
  if (call + 8 >= window) return WatchRole::timed_pick; // right before the burst
  if (phase + 4 >= period && phase + 1 < period) return WatchRole::timed_pick;
  return WatchRole::pick;
}

std::size_t watch_quiet(std::size_t call, std::size_t period) {
  const std::size_t window = 4 * period;
  if (call + 8 >= window) return 0; // the window's last timed picks and its burst
  const std::size_t phase = call % period, before_end = window - 8 - call;
  std::size_t run = 0;
  if (phase + 4 < period) {
    run = period - 4 - phase; // up to the period's three timed calls
  } else if (phase + 1 == period) {
    run = 1 + (period - 4); // the period's last call and the next one's untimed calls
  }
  return std::min(run, before_end);
}

// auto after its measurement (TuneResult): the pick, challenged in a burst at the end of every
// window of 4 x period calls (watch_role); after the burst watch_verdict decides.
void Allreducer::watched_call(float* buf, std::size_t n, TuneResult& w) {
  if (w.calls == 0) w.period = challenge_period(w, watch_challenger(w)); // a window starts
  const std::size_t period = w.period;
  const WatchRole role = watch_role(w.calls++, period);
  if (role == WatchRole::pick) { // untimed, and so are the next w.quiet calls
    quiet_ = watch_quiet(w.calls, period);
    quiet_pick_ = w.pick;
    return run(w.pick, buf, n);
  }
  AllreduceAlgo* const slot = watch_challenger(w);
  const bool challenge = role != WatchRole::timed_pick && slot != nullptr;
  const AllreduceAlgo algo = challenge ? *slot : w.pick;
  if (role == WatchRole::warm_challenger) {
    // A challenging window step times both kinds of stores afresh, in untimed calls, before
    // its timed ones: its store times may date from when the machine ran otherwise, and a
    // window step that is not the pick runs too seldom for its chooser's own tries of the
    // other kind (docs/collectives.md, "Stop 18").
    if (!challenge) return run(algo, buf, n);
    if (warm_call(algo, buf, n, w.cold, true)) {
      w.cold = 0;
    } else {
      --w.calls; // the burst's warm call again
    }
    return;
  }
  const double t0 = MPI_Wtime();
  timed_run(algo, buf, n);
  if (role == WatchRole::timed_pick) w.pick_s.push_back(MPI_Wtime() - t0);
  if (challenge) w.other_s.push_back(MPI_Wtime() - t0);
  if (w.calls < 4 * period) return;
  w.calls = 0;
  const double ep = error_of_fastest(w.pick_s, 5), eo = error_of_fastest(w.other_s, 5);
  double t[3] = {mean_of_fastest(w.pick_s, 5), mean_of_fastest(w.other_s, 5),
                 std::sqrt(ep * ep + eo * eo)}; // the largest error of any rank decides
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, t, 3, MPI_DOUBLE, MPI_MAX, comm_));
  w.pick_s.clear();
  w.other_s.clear();
  const WatchVerdict v =
      watch_verdict(w.pick_ref, t[0], t[1], w.drifted, 2 << std::min(w.remeasures, 4), t[2]);
  w.drifted = v == WatchVerdict::drifted ? w.drifted + 1 : 0;
  if (v == WatchVerdict::remeasure) { // every rank agrees: the next call starts a new trial
    // the window's store times are from before the change too: time both kinds again
    if (StoreChooser* st = window_stores(n)) st->forget();
    auto tr = std::make_unique<Trial>();
    tr->switches = w.switches;
    tr->remeasures = w.remeasures + 1;
    tr->replaced = w.pick;
    trials_[n] = std::move(tr);
    watch_n_ = 0;
    watch_ = nullptr;
    tuned_.erase(n); // w is gone
    return;
  }
  settle_window(w, v, slot, t[0], t[1]);
}

void settle_window(TuneResult& w, WatchVerdict v, AllreduceAlgo* slot, double pick_s,
                   double other_s) {
  const bool rechecked = w.recheck >= 0;
  w.recheck = -1;
  if (v == WatchVerdict::keep) w.pick_ref = pick_s;
  if (v == WatchVerdict::challenger && slot != nullptr) {
    std::swap(w.pick, *slot); // the old pick takes the challenger's place
    w.pick_ref = other_s;
    ++w.switches;
    if (!rechecked) { // a switch back after a recheck stands without another
      const auto in_dropped =
          slot >= w.dropped.data() && slot < w.dropped.data() + w.dropped.size();
      if (in_dropped) {
        const AllreduceAlgo old = *slot;
        w.dropped.erase(w.dropped.begin() + (slot - w.dropped.data()));
        w.others.push_back(old);
        w.recheck = static_cast<int>(w.others.size()) - 1;
      } else {
        w.recheck = static_cast<int>(slot - w.others.data());
      }
    }
  }
  ++w.turn;
}

AllreduceAlgo* watch_challenger(TuneResult& w) {
  if (w.recheck >= 0 && static_cast<std::size_t>(w.recheck) < w.others.size()) {
    return &w.others[static_cast<std::size_t>(w.recheck)];
  }
  if (w.turn % 4 == 3 && !w.dropped.empty()) return &w.dropped[w.turn / 4 % w.dropped.size()];
  if (!w.others.empty()) return &w.others[w.turn % w.others.size()];
  return nullptr;
}

Allreducer::Groups* Allreducer::window_group() const {
  const int c = two_level_row(AllreduceAlgo::hierarchical, size_, opt_.node_size);
  if (c <= 0) return nullptr;
  const auto g = groups_.find(c);
  if (g == groups_.end() || !g->second->shared) return nullptr; // no window: a ring
  return g->second;
}

StoreChooser* Allreducer::window_stores(std::size_t n) const {
  Groups* g = window_group();
  if (g == nullptr) return nullptr;
  return store_chooser(opt_.window_stores, g->window->choice, g->window->segment_now(n));
}

std::optional<StoreChooser> Allreducer::window_stores_of(std::size_t n) const {
  const StoreChooser* st = window_stores(n);
  if (st == nullptr) return std::nullopt;
  return *st;
}

std::optional<std::size_t> Allreducer::window_segment_of(std::size_t n) const {
  const Groups* g = window_group();
  if (g == nullptr || n <= SegmentChooser::kShort) return std::nullopt;
  const SegmentChooser* c = g->window->segment_chooser_seen(n);
  return c == nullptr ? 0 : c->pick();
}

WindowStepTimes Allreducer::window_step_times() const {
  const Groups* g = window_group();
  return g == nullptr ? WindowStepTimes{} : g->times;
}

bool Allreducer::warm_call(AllreduceAlgo algo, float* buf, std::size_t n, int& cold, bool afresh) {
  const bool window_step = algo == AllreduceAlgo::hierarchical;
  if (window_step && afresh && cold == 0) {
    if (StoreChooser* st = window_stores(n)) st->forget();
  }
  run(algo, buf, n); // a first call makes the window and its choosers
  if (!window_step || window_stores(n) == nullptr) return true;
  return ++cold >= 8 || window_stores_known(n);
}

bool Allreducer::window_stores_known(std::size_t n) {
  const StoreChooser* st = window_stores(n);
  int known = st == nullptr || st->timed_both() ? 1 : 0;
  PT_MPI(MPI_Allreduce(MPI_IN_PLACE, &known, 1, MPI_INT, MPI_MIN, comm_));
  return known == 1;
}

bool Allreducer::settled(std::size_t n) const {
  return opt_.algo || !opt_.tune || size_ == 1 || n == 0 || tuned_.count(n) != 0;
}

// The algorithms that run differently on this communicator: the two-level ones where they have
// two levels (two_level_row), except hierarchical on one node reached by messages (a ring).
std::vector<AllreduceAlgo> Allreducer::distinct_algorithms() {
  std::vector<AllreduceAlgo> out = {AllreduceAlgo::mpi, AllreduceAlgo::ring,
                                    AllreduceAlgo::recursive_doubling, AllreduceAlgo::rabenseifner};
  const int g = two_level_row(AllreduceAlgo::hierarchical, size_, opt_.node_size);
  if (g > 0 && (g < size_ || groups(g).shared)) out.push_back(AllreduceAlgo::hierarchical);
  if (two_level_row(AllreduceAlgo::torus2d, size_, 0) > 0) out.push_back(AllreduceAlgo::torus2d);
  return out;
}

void measurement_drops(int round, const std::vector<double>& fastest_call,
                       std::vector<char>& alive) {
  const double best = *std::min_element(fastest_call.begin(), fastest_call.end());
  const double limit = round == 1 ? 10.0 : 1.5;
  for (std::size_t i = 0; i < alive.size(); ++i) {
    if (fastest_call[i] > limit * best) alive[i] = 0;
  }
}

std::size_t measurement_pick(const std::vector<double>& seconds, const std::vector<double>& error,
                             const std::vector<char>& alive, std::size_t model, std::size_t kept) {
  std::size_t best = seconds.size();
  for (std::size_t i = 0; i < seconds.size(); ++i) {
    if (alive[i] && (best == seconds.size() || seconds[i] < seconds[best])) best = i;
  }
  if (model >= seconds.size() || !alive[model] || model == best) return best;
  const double gap = seconds[model] - seconds[best];
  const double noise =
      kept < 5 ? 0.0 : 2.0 * std::sqrt(error[model] * error[model] + error[best] * error[best]);
  return seconds[model] <= 1.03 * seconds[best] || gap <= noise ? model : best;
}

std::size_t measurement_default(const std::vector<AllreduceAlgo>& cand, AllreduceAlgo model,
                                std::optional<AllreduceAlgo> replaced) {
  const auto at = [&](AllreduceAlgo a) {
    return static_cast<std::size_t>(std::find(cand.begin(), cand.end(), a) - cand.begin());
  };
  if (replaced && at(*replaced) < cand.size()) return at(*replaced);
  return at(model);
}

// auto's measurement of a new size, on the caller's own calls (STAR-MPI's approach: Faraj, Yuan &
// Lowenthal, ICS 2006): successive calls run each distinct algorithm in turn, after a barrier. Each
// candidate runs two calls in a row, the second timed: the first sets up windows, sub-communicators
// and scratch, and brings back into cache the memory that the other candidates' calls pushed out (a
// window step timed alone among other algorithms' calls ran up to 2x slower than in a run of its
// own calls: docs/collectives.md). After the first round the hopeless ones drop out, after the
// second the slow ones (measurement_drops), and the others get more rounds: as many as fit 20 ms of
// the fastest one's calls, 3 to 10 in all (a trainer calls each bucket size once per step, or a few
// times: at most 6 x 2 x 10 calls, and 7 untimed ones of the window step while its stores are
// timed). Every rank takes the mean of each candidate's fastest 2/3 of calls (with 3 rounds one
// slow call does not decide), the max over ranks decides, so all ranks pick alike at the same call;
// the model's choice (in a re-measurement: the pick it replaces, measurement_default) stays
// unless another is faster beyond the noise (measurement_pick). Every call
// returns the exact sum; which algorithm rounded it differs between calls.
void Allreducer::tuning_call(float* buf, std::size_t n) {
  std::unique_ptr<Trial>& tr = trials_[n];
  if (!tr) tr = std::make_unique<Trial>();
  if (tr->cand.empty()) {
    tr->cand = distinct_algorithms();
    tr->alive.assign(tr->cand.size(), 1);
    tr->calls.resize(tr->cand.size());
    tr->at_drop.assign(tr->cand.size(), 0.0);
  }
  const std::size_t k = tr->cand.size(), c = tr->next;
  if (!tr->warm) { // untimed: a candidate's first call after the others' finds its memory cold
    // the window step's first calls of a new size also time both kinds of stores afresh (its
    // times may come from another size, or be stale): five calls of one segment (the ranks
    // agree on the times one segment late), eight at most
    tr->warm = warm_call(tr->cand[c], buf, n, tr->cold, tr->round == 0);
    return;
  }
  PT_MPI(MPI_Barrier(comm_));
  const double t0 = MPI_Wtime();
  timed_run(tr->cand[c], buf, n);
  tr->calls[c].push_back(MPI_Wtime() - t0);
  tr->warm = false;
  tr->next = c + 1;
  while (tr->next < k && !tr->alive[tr->next]) ++tr->next;
  if (tr->next < k) return;
  // end of a round: agree on each candidate's time (max over ranks of its fastest 2/3 of calls),
  // followed by the standard error of that time (the largest of any rank)
  auto agree = [&](std::size_t drop_one_in) {
    std::vector<double> med(2 * k, 0.0);
    for (std::size_t i = 0; i < k; ++i) {
      med[i] = tr->alive[i] ? mean_of_fastest(tr->calls[i], drop_one_in) : 1e30; // out: slowest
      if (tr->alive[i]) med[k + i] = error_of_fastest(tr->calls[i], drop_one_in);
    }
    PT_MPI(MPI_Allreduce(MPI_IN_PLACE, med.data(), static_cast<int>(2 * k), MPI_DOUBLE, MPI_MAX,
                         comm_));
    return med;
  };
  ++tr->round;
  if (tr->round <= 2) { // drop the slow ones, each judged by its fastest call
    std::vector<double> fastest = agree(1);
    fastest.resize(k); // the times alone
    for (std::size_t i = 0; i < k; ++i) {
      if (tr->alive[i]) tr->at_drop[i] = fastest[i];
    }
    measurement_drops(tr->round, fastest, tr->alive);
    if (tr->round == 1) {
      const double best = *std::min_element(fastest.begin(), fastest.end());
      tr->rounds = std::clamp(static_cast<int>(0.02 / std::max(best, 1e-9)), 3, 10);
    }
  }
  tr->next = 0;
  while (!tr->alive[tr->next]) ++tr->next;
  if (tr->round < tr->rounds) return;
  std::vector<double> med = agree(3);
  TuneResult res;
  res.switches = tr->switches;
  res.remeasures = tr->remeasures;
  res.model = choose_algorithm(static_cast<double>(n) * sizeof(float), size_, opt_.node_size,
                               opt_.topology);
  for (std::size_t i = 0; i < k; ++i) {
    res.seconds.emplace_back(tr->cand[i], tr->alive[i] ? med[i] : tr->at_drop[i]);
  }
  const std::vector<double> error(med.begin() + static_cast<std::ptrdiff_t>(k), med.end());
  med.resize(k);
  const auto kept = static_cast<std::size_t>(tr->rounds - tr->rounds / 3); // fastest_kept's
  const std::size_t tie = measurement_default(tr->cand, res.model, tr->replaced);
  res.pick = tr->cand[measurement_pick(med, error, tr->alive, tie, kept)];
  for (std::size_t i = 0; i < k; ++i) {
    if (tr->cand[i] != res.pick) (tr->alive[i] ? res.others : res.dropped).push_back(tr->cand[i]);
  }
  tuned_[n] = std::move(res);
  trials_.erase(n);
}

void allreduce_sum(float* buf, std::size_t n, MPI_Comm comm, AllreduceAlgo algo, int node_size) {
  AllreduceOptions opt;
  opt.algo = algo;
  opt.node_size = node_size;
  Allreducer(comm, opt).sum(buf, n);
}

} // namespace pt
