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

void record(std::size_t i, Clock::time_point t0) {
  seconds[i] += std::chrono::duration<double>(Clock::now() - t0).count();
  ++calls[i];
}

// One wrapper per op: F is the op's function-pointer type, Field the Backend member holding it.
template <std::size_t I, class F> struct Timed;
template <std::size_t I, class R, class... A> struct Timed<I, R (*)(A...)> {
  template <R (*Backend::*Field)(A...)> static R call(A... a) {
    static_assert(I < kOps);
    inner->synchronize();
    const Clock::time_point t0 = Clock::now();
    if constexpr (std::is_void_v<R>) {
      (inner->*Field)(a...);
      inner->synchronize();
      record(I, t0);
    } else {
      R r = (inner->*Field)(a...);
      inner->synchronize();
      record(I, t0);
      return r;
    }
  }
};

} // namespace

const Backend& profiled_backend(const Backend& in) {
  static const Backend table = [&] {
    inner = &in;
    Backend b = in;
#define PT_TIMED_OP(op)                                                                            \
  b.op = &Timed<index_of(#op), decltype(Backend::op)>::template call<&Backend::op>;
    PT_BACKEND_OPS(PT_TIMED_OP)
#undef PT_TIMED_OP
    return b;
  }();
  return table;
}

std::vector<OpTime> op_times() {
  std::vector<OpTime> out;
  for (std::size_t i = 0; i < kOps; ++i) out.push_back({kNames[i], calls[i], seconds[i]});
  return out;
}

void reset_op_times() {
  calls.fill(0);
  seconds.fill(0.0);
}

} // namespace pt
