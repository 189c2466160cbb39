// Float32 sum all-reduce algorithms on MPI point-to-point (comm.allreduce in the deck).
// Cost models (alpha = latency, beta = time per byte, gamma = reduction time per byte, n bytes,
// p ranks; Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
// MPICH", IJHPCA 2005; Patarasuk & Yuan, JPDC 2009):
//   ring                 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma   (bandwidth-optimal)
//   recursive doubling   log2(p) (alpha + n beta + n gamma)                   (latency-optimal)
//   rabenseifner         2 log2(p) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
// Non-powers of two: the first 2r ranks (r = p - 2^floor(log2 p)) pair up and fold first.
// topology.hpp models each algorithm per level; "auto" takes the least modelled time.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/topology.hpp"

namespace pt {

class Watchdog;

// Deck name -> algorithm: "mpi", "ring", "recursive-doubling", "rabenseifner", "hierarchical",
// "torus2d"; "auto" -> nullopt. Throws std::invalid_argument for other names.
std::optional<AllreduceAlgo> parse_allreduce(const std::string& name);

// How hierarchical's shared-window step stores into the window. Plain (cached) stores into lines
// that another core read last must first take them back from that core's cache; where the two
// cores sit far apart (on this VM: a core-to-core round trip of 330 ns against 85 ns, changing
// with the host's placement of the virtual CPUs) that ran 8x slower than streaming stores,
// which send whole lines to memory. Where the cores are close, plain stores were 1.5-1.9x
// faster for the whole step. adaptive: times both per segment, see shm_two_level.
enum class WindowStores { adaptive, cached, streaming };

// adaptive window stores for segments of one size, chosen jointly by the window's ranks: the
// kind in use (0 cached, 1 streaming) and a time per float of each kind, the same on every rank
// (a new class starts with the kind of the class timed last: seed). The other kind is first
// tried right after the first segment, then runs the last 3 of every period segments (period 16
// to 512, a power of two, chosen to keep the tries near 2% of the time). Each rank learns its
// own times: a smoothed time of the kind in use, and the median of a try's three segments for
// the other. After every segment the ranks agree on them (the slowest rank's, since the step
// waits for it; the window carries them, see shm_two_level), so every rank has the same period;
// when a try has ended, the faster agreed kind is kept by every rank alike. Ranks that chose
// alone could end up one on each kind, and then their tries, on the same segments, only swapped
// which rank used which: a machine state where one kind is slow left such a pair on the slow
// mixture (docs/collectives.md, "Stop 22").
class StoreChooser {
public:
  // The kind for the next segment (the same on every rank). hold: the kind in use, no try
  // (auto's timed calls: the chooser is shared by a window pool's users, and their segments
  // bring its tries round at any call); a try cut by held segments goes on after them.
  int next(bool hold = false) const;
  // This rank's time of the segment it ran with kind. True when a try of the other kind has
  // just ended (on every rank at the same segment).
  bool learn(int kind, double seconds_per_float);
  // The times agreed over the ranks, the largest of own(0) and own(1) (0: not timed), from the
  // segment after which segments_timed() was `timed`; after a try (try_ended: what learn
  // returned on that segment) the faster kind is kept. Times from before a forget (another
  // count) change nothing. A rank alone agrees with itself.
  void agree(double cached, double streaming, bool try_ended, std::uint64_t timed);
  double own(int kind) const { return own_[kind]; } // this rank's seconds per float; 0: none
  // Before anything is timed: start with the kind of the chooser of the segment size timed
  // last. Not its times: the ratio of the two kinds changes with the segment size (at 8 KiB
  // cached stores won where streaming ones ran 10x faster at 128 KiB), and a seeded time of
  // the other kind put off its try for up to 512 segments of a size that auto's window step,
  // once it lost its measurement, ran only a few times per thousand calls.
  void seed(const StoreChooser& last);
  int kind() const { return kind_; }
  double per_float(int kind) const { return per_float_[kind]; } // agreed seconds; 0: none yet
  std::uint64_t segments_timed() const { return timed_; }
  bool timed_both() const { return per_float_[0] > 0.0 && per_float_[1] > 0.0; }
  // Both times forgotten, the kind kept: the next segments time both again (auto's
  // re-measurement of a size, after the costs changed under its pick).
  void forget();

private:
  static constexpr int kTrial = 3;   // segments per try of the other kind
  double per_float_[2] = {0.0, 0.0}; // agreed over the ranks; 0: not yet
  double own_[2] = {0.0, 0.0};       // this rank's; 0: not timed yet
  int kind_ = 0;
  std::uint64_t timed_ = 0;
  double trial_[kTrial] = {};
  int tried_ = 0;
};

// The window step's segment length for messages of one size class (2^k to 2^(k+1) floats, more
// than one short segment), chosen from whole calls: long segments (kWindowSegmentFloats, 1 MiB)
// and short ones (a quarter of that) alternate call by call until each has kCalls calls timed.
// Then every rank's median seconds per float of each length, the slowest rank's over the whole
// communicator (agree: every node's window must pick the same length, since the step between
// nodes exchanges chunks of the segments), pick the length for good. Short segments must be
// more than kMargin faster: a near-tie keeps the long ones, the length of the earlier machines.
// On the AMD EPYC development machine 1 MiB segments were as fast or faster (256 KiB ones
// 1.1-1.4x slower from 16 MiB); on an Intel Xeon with 2 MiB of L2 per core, 256 KiB ones made
// the step 20% faster at 2 MiB and 10-18% at 4 MiB (docs/collectives.md, "Stop 24").
class SegmentChooser {
public:
  static constexpr std::size_t kLong = kWindowSegmentFloats, kShort = kWindowSegmentFloats / 4;
  static constexpr int kCalls = 6;        // timed calls of each length before the pick
  static constexpr double kMargin = 0.03; // short must be faster by this fraction
  // The segment length of the next call (the same on every rank). hold: the pick, or the long
  // length while choosing; such a call is not learned from (auto's timed calls).
  std::size_t next(bool hold = false) const;
  // This rank's time of a call that ran segments of len. True when both lengths have kCalls
  // calls: the ranks must agree now (on every rank at the same call).
  bool learn(std::size_t len, double seconds_per_float);
  // This rank's median seconds per float of the long and the short calls (0: none yet).
  std::pair<double, double> medians() const;
  // The medians agreed over the ranks (the largest of each): the pick, for good.
  void agree(double long_spf, double short_spf);
  std::size_t pick() const { return pick_; } // 0: still choosing
  int calls_timed() const { return static_cast<int>(long_.size() + short_.size()); }

private:
  std::vector<double> long_, short_; // this rank's seconds per float, per call
  std::size_t pick_ = 0;
};

// Where the window step's time went, summed over its segments with a store chooser since the
// Allreducer was made (for the bench's report): the timed parts (what the chooser learns from)
// and the one untimed part, the wait at the synchronization after the copy-in.
struct WindowStepTimes {
  double timed = 0.0, wait = 0.0; // seconds
  std::uint64_t segments = 0;
};

// The shared-memory windows of hierarchical's node-local step: one per group of ranks that
// share a node, with the store choosers that learn it (its mailboxes are in it). Allreducers
// given one pool (AllreduceOptions::windows) step through one window where their node groups
// are the same ranks in the same order, each regrowing it as its messages need. How fast a
// window runs is partly its memory's: six instances with windows of their own and fixed stores
// differed by 1.07-1.27x per round of the instances bench (10-20% over seconds, a different
// window slow each time), one window shared by all of them by 1.02-1.03x (docs/collectives.md,
// "Stop 23"). Sharing saves the node's memory too (a window per instance holds a segment of up
// to 2 MiB per rank). Allreducers of one pool must not run at the same time (one thread, or
// calls ordered by the caller); every rank calls them in the same order, as for any collective.
// Free it, and every Allreducer holding it, before MPI_Finalize.
class WindowPool {
public:
  WindowPool();
  ~WindowPool();
  WindowPool(const WindowPool&) = delete;
  WindowPool& operator=(const WindowPool&) = delete;
  std::size_t windows() const { return windows_.size(); } // made so far

private:
  friend class Allreducer;
  struct Window;
  // the window of the node group of row (the same ranks in the same order), made collectively
  // over row on first use
  Window& window_of(MPI_Comm row);
  std::vector<std::unique_ptr<Window>> windows_;
};

struct AllreduceOptions {
  std::optional<AllreduceAlgo> algo; // nullopt: auto (the model's choice, or measured: tune)
  int node_size = 0;                 // ranks per node, consecutive ranks; 0 or 1: one per node
  Topology topology = topology_preset("fat-tree");
  bool shared_memory = true; // hierarchical: node-local step through an MPI-3 shared window
  WindowStores window_stores = WindowStores::adaptive;
  std::shared_ptr<WindowPool> windows; // null: a pool of this Allreducer's own
  // auto: the first calls of each size try every distinct algorithm (MPI_Allreduce included)
  // in turn, timed, and the fastest is kept (comm.autotune); false: the model alone decides
  bool tune = true;
  const Watchdog* watchdog = nullptr;  // "mpi": MPI_Allreduce under the hang watchdog
  std::string what = "the all-reduce"; // for the watchdog's message
};

// Mean of the fastest calls, dropping the slowest size/drop_one_in of them (at least one is
// kept; none measured: 1e30): a stalled call or two (a descheduled rank) do not decide, and a
// time that alternates between two levels is weighed by how often each occurs.
double mean_of_fastest(std::vector<double> seconds, std::size_t drop_one_in);

// Which candidates stay in auto's measurement after its timed round `round` (1 or 2), from each
// one's fastest call so far (max over ranks): after the first round only the hopeless ones, more
// than 10x behind the fastest, drop out; after the second those more than 1.5x behind. A single
// call can run slow by 2-3x (a 256 MiB window step timed once at 87 ms, 39 ms in its column, on
// the 2-core VM; a 2 MiB one at 1528 us, 424 us in its column, on a 16-core host), so every
// candidate within 10x is judged on the faster of two calls.
void measurement_drops(int round, const std::vector<double>& fastest_call,
                       std::vector<char>& alive);

// auto's pick at the end of its measurement (an index into the candidates), from each one's
// agreed time, the standard error of that time (both max over ranks), which ones stayed in, and
// the model's choice (its index; out of range: not a candidate). The fastest, unless the model's
// choice stayed in and is within 3% of it or within twice the standard error of their
// difference: below a few microseconds recursive doubling and MPI_Allreduce differ by less than
// one call jitters, and a 3% margin alone picked the one that the benchmark's columns then timed
// 1.13-1.24x slower (docs/collectives.md, "Stop 21"). The watch judges a challenger the same way.
// kept: how many calls each time rests on. Below 5 the errors are left out and the margin alone
// decides: the standard error of two calls says little (its 95% t-quantile is 12.7, not 2), and
// at 256 MiB, with three calls a candidate (two kept), it kept the model's ring 1.24x behind
// the window step (docs/collectives.md, "Stop 22").
std::size_t measurement_pick(const std::vector<double>& seconds, const std::vector<double>& error,
                             const std::vector<char>& alive, std::size_t model, std::size_t kept);

// Which candidate wins a measurement's near-ties (measurement_pick's `model`; out of range:
// none): the model's choice, except in a re-measurement, where the pick it replaces does
// (replaced). That pick beat the model's choice when the size was first measured and then held
// against the watch's challenges; the re-measurement starts because its time moved, in the
// middle of that change. One taken so (stop 23, run a3 at 128 KiB) timed the window step, the
// pick, fastest, 27.4 against ring's 29.1 us, yet handed the size to ring, the model's choice,
// by the noise rule; the columns then ran the window step at 18.7 us, ring at 26.7.
std::size_t measurement_default(const std::vector<AllreduceAlgo>& cand, AllreduceAlgo model,
                                std::optional<AllreduceAlgo> replaced);

// What auto's measurement found for one message size: every candidate's time (max over ranks of its
// mean fastest-2/3 call; one that dropped out keeps its fastest call at the drop) and the pick. The
// model's choice (in a re-measurement, the pick it replaces: measurement_default) wins near-ties
// (measurement_pick). Afterwards each window of 64 calls ends with a
// burst of five calls of one of the other candidates (watch_role): those that stayed within 1.5x in
// turn, and in every 4th window one of those that dropped out (they may have become the fastest). A
// window step that challenges first repeats its untimed call until its store chooser has timed both
// kinds afresh (up to 8 calls: its times may date from another state of the machine). A challenger
// measured far behind gets longer windows (up to 1,024 calls), so trying it costs about 2% of the
// pick's time or less. The challenger replaces the pick when its calls were more than 3% faster,
// beyond their noise (watch_verdict): a machine whose cross-core or network cost drifts changes its
// fastest algorithm. The three calls before each burst time the pick: when its time is more than
// 1.5x away (either way) from the last window that was not, in two windows in a row, the costs have
// changed under it: the size is measured again from scratch. Each re-measurement doubles the
// windows in a row that the next one needs (up to 32), so a machine whose costs flip back and forth
// does not spend its time measuring.
struct TuneResult {
  AllreduceAlgo pick = AllreduceAlgo::ring;
  AllreduceAlgo model = AllreduceAlgo::ring;
  std::vector<std::pair<AllreduceAlgo, double>> seconds;
  std::vector<AllreduceAlgo> others;  // challengers, in turn
  std::vector<AllreduceAlgo> dropped; // challengers every 4th window, in turn
  int switches = 0;                   // picks replaced since the first measurement
  int remeasures = 0;                 // measurements after the first
  // the watch in progress
  std::size_t calls = 0, turn = 0; // calls in this window, windows so far
  std::size_t period = 16;         // calls per challenge in this window (set as it starts)
  std::vector<double> pick_s, other_s;
  double pick_ref = 0.0; // the pick's time in the last window within 1.5x (0: none yet)
  int drifted = 0;       // windows in a row more than 1.5x away from pick_ref
  int recheck = -1;      // after a switch: the old pick's index in others, its next challenger
  int cold = 0;          // untimed calls so far of a challenging window step (its store times)
};

// The standard error of mean_of_fastest's mean: the standard deviation of the calls it keeps
// over the square root of their number (0 with fewer than two).
double error_of_fastest(std::vector<double> seconds, std::size_t drop_one_in);

// The watch's verdict at the end of a window, from times agreed over ranks: the pick's
// reference time (0: none), its time in this window and the challenger's (none run: 1e30), how
// many windows right before this one were more than 1.5x away from the reference, how many
// in a row a re-measurement needs, and the standard error of the difference of the two times.
// The challenger wins when it is more than 3% faster and the difference is more than twice its
// standard error: below a microsecond a call's time jitters by more than the algorithms differ,
// and a 3% margin alone switched between recursive doubling and MPI_Allreduce up to 6 times in a
// benchmark row (docs/collectives.md, "Stop 18"). Faster than the pick's better time of this
// window and the reference (the last window kept), so that a pick slowed for one window only
// (within 1.5x; more is a drift) does not hand the size to a challenger that is slower in the
// windows around it; a pick slower for good moves the reference one window later, and loses
// then (docs/collectives.md, "Stop 23").
enum class WatchVerdict { keep, challenger, drifted, remeasure };
WatchVerdict watch_verdict(double pick_ref, double pick_now, double challenger, int drifted_before,
                           int needed, double error);

// The watch's bookkeeping after a window's verdict (keep or challenger; the others change
// nothing here), with slot the window's challenger (in others or dropped) and the window's
// agreed times. A challenger that wins becomes the pick and the old pick takes its place. One
// window's win may be noise, or a stall of the pick: so the old pick moves to others and
// challenges again in the very next window (recheck), instead of waiting its turn, which for a
// dropped candidate came every 4th window only. Advances the window count.
void settle_window(TuneResult& w, WatchVerdict v, AllreduceAlgo* slot, double pick_s,
                   double other_s);
// The challenger of the watch's next window (its place in others or dropped), or none.
AllreduceAlgo* watch_challenger(TuneResult& w);
// The watch's calls in a window of 4 x period: the pick, untimed, except three timed calls
// before the end of each period (the last three right before the burst), and at the end a
// burst of five calls of the challenger, the first untimed. That first call finds the memory
// that the pick's calls pushed out of cache cold (a window step timed alone among
// MPI_Allreduce calls ran up to 2x slower than in a run of its own calls), so the four timed
// ones compare the challenger in its steady state with the pick in its own.
enum class WatchRole { pick, timed_pick, warm_challenger, timed_challenger };
WatchRole watch_role(std::size_t call, std::size_t period);
// How many calls in a row, from call on, have watch_role pick (0: call itself has not). sum()
// runs them without the watch's bookkeeping: on an 8-byte message, where a call takes about
// 0.3 us on two ranks of one node, that bookkeeping cost auto 3-7% against the column of the
// same algorithm (docs/collectives.md).
std::size_t watch_quiet(std::size_t call, std::size_t period);
// Calls per challenge for the pick's and the challenger's measured times (challenger 0: none):
// 16, doubled (up to 256) while trying the challenger would cost more than 2% of the pick's
// time, or while a window (4 periods) would last less than 100 us of the pick's calls, so that
// the watch's own work on sub-microsecond messages (four timed calls per period and one
// all-reduce of two numbers per window) stays near 1%.
std::size_t watch_period(double pick_s, double challenger_s);
// watch_period for the next window of w with challenger (none: nullptr): the challenger's time
// from the measurement, the pick's from the last window kept (pick_ref) once there is one. The
// measurement's time of the window step was often 1.3-1.9x its column's (its first calls of a
// size run cold), and the period from it was too short: at 256 KiB in stop 23's run e4 it
// had the window step at 43 us and ring at 48, so ring challenged every 64 calls, where the
// window step then ran at 25 us: five calls of ring per window cost about 7% of the pick's time.
std::size_t challenge_period(const TuneResult& w, const AllreduceAlgo* challenger);

// In-place sums over one communicator. Keeps what repeated calls need: scratch memory, the
// sub-communicators of the two-level algorithms and the shared-memory window, so a training
// step neither allocates nor creates communicators. Every rank of comm calls sum() with the
// same n. Free it before MPI_Finalize.
class Allreducer {
public:
  Allreducer(MPI_Comm comm, AllreduceOptions opt);
  ~Allreducer();
  Allreducer(const Allreducer&) = delete;
  Allreducer& operator=(const Allreducer&) = delete;

  void sum(float* buf, std::size_t n);
  // The algorithm sum() runs for n floats (auto: measured once sum() has seen n, else the
  // model's choice).
  AllreduceAlgo algorithm_for(std::size_t n) const;
  // auto with tune: what the measurement found, per size in floats.
  const std::map<std::size_t, TuneResult>& tuned() const { return tuned_; }
  // False while auto is still trying algorithms for n (every rank agrees at every call).
  bool settled(std::size_t n) const;
  int size() const { return size_; }
  // True when hierarchical's node-local step ran through the shared-memory window.
  bool used_shared_memory() const { return used_shm_; }
  // This rank's store chooser of the window step for n floats, as it stands (for the bench's
  // report), or none: no window yet, or stores not adaptive for that segment size.
  std::optional<StoreChooser> window_stores_of(std::size_t n) const;
  // The window step's segment length for n floats as it stands (SegmentChooser::pick, 0 while
  // choosing), or none: no window yet, or n not longer than a short segment.
  std::optional<std::size_t> window_segment_of(std::size_t n) const;
  WindowStepTimes window_step_times() const; // this rank's, of this Allreducer's window steps

private:
  struct Groups; // row/column communicators of a two-level scheme and the node's window
  Groups& groups(int c);
  void two_level(float* buf, std::size_t n, int c, bool node_local);
  void shm_two_level(float* buf, std::size_t n, Groups& g);
  // After a segment's first sync: the times that every rank's chooser posted after the segment
  // learned last, agreed (the largest of each kind) into that chooser on every rank alike.
  void agree_stores(WindowPool::Window& win, int q);
  void run(AllreduceAlgo algo, float* buf, std::size_t n);
  // run, for one of auto's timed calls: the window step's store chooser holds its tries
  void timed_run(AllreduceAlgo algo, float* buf, std::size_t n);
  std::vector<AllreduceAlgo> distinct_algorithms();
  struct Trial; // auto's measurement in progress for one size
  // False while the window step's store chooser for n floats has not timed both kinds (agreed
  // over ranks): auto's measurement keeps that candidate's calls untimed until then.
  bool window_stores_known(std::size_t n);
  Groups* window_group() const;                     // hierarchical's groups, if they have a window
  StoreChooser* window_stores(std::size_t n) const; // the window step's chooser for n, if any
  // One untimed call of algo, for auto's measurement or the watch's burst. The window step's
  // store chooser first forgets its times (afresh, at the first such call: cold 0) and these
  // calls go on until it has timed both kinds on every rank (window_stores_known), at most 8
  // (cold counts them). True when the next call may be timed.
  bool warm_call(AllreduceAlgo algo, float* buf, std::size_t n, int& cold, bool afresh);
  void tuning_call(float* buf, std::size_t n);
  void watched_call(float* buf, std::size_t n, TuneResult& w);

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  // auto's watched size: sum()'s short way runs the next quiet_ calls of it (untimed picks,
  // watch_quiet) with no more than these few bytes read, next to what every algorithm reads;
  // quiet_ran_ of them ran since the watch last counted its calls
  std::size_t watch_n_ = 0, quiet_ = 0, quiet_ran_ = 0;
  AllreduceAlgo quiet_pick_ = AllreduceAlgo::mpi;
  TuneResult* watch_ = nullptr; // the entry of watch_n_
  AllreduceOptions opt_;
  std::vector<float> tmp_, tmp2_; // scratch kept between calls
  std::map<int, Groups*> groups_;
  bool used_shm_ = false;
  std::shared_ptr<WindowPool> pool_; // opt_.windows, or one of its own
  bool hold_tries_ = false;          // in a timed_run
  std::map<std::size_t, TuneResult> tuned_;
  std::map<std::size_t, std::unique_ptr<Trial>> trials_;
  // auto: the last size's choice (the trainer repeats a few bucket sizes)
  mutable std::size_t last_n_ = 0;
  mutable AllreduceAlgo last_algo_ = AllreduceAlgo::ring;
};

// One-off sum (tests, tools): builds an Allreducer for the call.
void allreduce_sum(float* buf, std::size_t n, MPI_Comm comm, AllreduceAlgo algo, int node_size = 0);

} // namespace pt
