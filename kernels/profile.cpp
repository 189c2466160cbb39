#include "profile.hpp"

#include <array>
#include <chrono>
#include <iterator>
#include <string_view>
#include <type_traits>

namespace pt {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kNames[] = {
#define PT_OP_NAME(op) #op,
    PT_BACKEND_OPS(PT_OP_NAME)
#undef PT_OP_NAME
        "copy",
};
constexpr std::size_t kOps = std::size(kNames);

constexpr std::size_t index_of(std::string_view name) {
  for (std::size_t i = 0; i < kOps; ++i) {
    if (name == kNames[i]) return i;
  }
  return kOps;
}

const Backend* inner = nullptr;
std::array<long long, kOps> calls{};
std::array<double, kOps> seconds{};

struct Pending { // an op bracketed by two markers, not yet read
  std::size_t op;
  int from, to;
};
std::vector<Pending> pending;

// Waits for the inner backend and adds the markers' times (they start over after the wait).
void synchronize_and_read() {
  inner->synchronize();
  for (const Pending& p : pending) seconds[p.op] += inner->seconds(p.from, p.to);
  pending.clear();
}

// Runs f, one call of op i, timed.
template <class F> auto timed(std::size_t i, F f) {
  ++calls[i];
  if (inner->mark != nullptr) {
    const int from = inner->mark();
    struct Close { // records the closing marker after f, also when f returns a value
      std::size_t i;
      int from;
      ~Close() { pending.push_back({i, from, inner->mark()}); }
    } close{i, from};
    return f();
  }
  const Clock::time_point t0 = Clock::now();
  struct Close {
    std::size_t i;
    Clock::time_point t0;
    ~Close() { seconds[i] += std::chrono::duration<double>(Clock::now() - t0).count(); }
  } close{i, t0};
  return f();
}

// One wrapper per op: F is the op's function-pointer type, Field the Backend member holding it.
template <std::size_t I, class F> struct Timed;
template <std::size_t I, class R, class... A> struct Timed<I, R (*)(A...)> {
  template <R (*Backend::*Field)(A...)> static R call(A... a) {
    static_assert(I < kOps);
    return timed(I, [&] { return (inner->*Field)(a...); });
  }
};

void timed_copy(void* dst, const void* src, std::size_t bytes) {
  timed(index_of("copy"), [&] { inner->copy(dst, src, bytes); });
}

} // namespace

const Backend& profiled_backend(const Backend& in) {
  static const Backend table = [&] {
    inner = &in;
    Backend b = in;
    b.copy = timed_copy;
    b.synchronize = synchronize_and_read;
#define PT_TIMED_OP(op)                                                                            \
  b.op = &Timed<index_of(#op), decltype(Backend::op)>::template call<&Backend::op>;
    PT_BACKEND_OPS(PT_TIMED_OP)
#undef PT_TIMED_OP
    return b;
  }();
  return table;
}

std::vector<OpTime> op_times() {
  if (inner != nullptr) synchronize_and_read();
  std::vector<OpTime> out;
  for (std::size_t i = 0; i < kOps; ++i) out.push_back({kNames[i], calls[i], seconds[i]});
  return out;
}

void reset_op_times() {
  if (inner != nullptr) synchronize_and_read();
  calls.fill(0);
  seconds.fill(0.0);
}

} // namespace pt
