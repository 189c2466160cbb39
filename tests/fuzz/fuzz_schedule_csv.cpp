// libFuzzer target: a schedule file (parallel.schedule = "file:PATH") through schedule::from_csv,
// which rank 0 runs on the file's text before anything trains (docs/fuzzing.md).
//
// Input: three bytes choose the run's shape (pp 1..4, micro-batches 1..8, virtual_stages 1..3),
// the rest is the file. A bad file must end in std::invalid_argument, which the trainer turns into
// exit 2; any other exception, a sanitizer report or a hang is a finding. An accepted file must be
// a valid schedule of that shape, and written back with to_csv it must read back to itself.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "fuzz_common.hpp"
#include "schedule/schedule.hpp"
#include "schedule/validate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const int p = 1 + data[0] % 4, m = 1 + data[1] % 8, v = 1 + data[2] % 3;
  const std::string text(reinterpret_cast<const char*>(data + 3), size - 3);
  pt::schedule::Schedule s;
  try {
    s = pt::schedule::from_csv(text, p, m, v);
  } catch (const std::invalid_argument& e) {
    if (fuzz::verbose()) std::fprintf(stderr, "rejected: %s\n", e.what());
    return 0;
  }
  const pt::schedule::Validation check = pt::schedule::validate(s);
  if (!check.ok) fuzz::finding("from_csv accepted an invalid schedule", check.error);
  const std::string back = pt::schedule::to_csv(s);
  try {
    if (pt::schedule::from_csv(back, p, m, v).ranks != s.ranks) {
      fuzz::finding("to_csv does not read back to the same schedule", back);
    }
  } catch (const std::invalid_argument& e) {
    fuzz::finding("to_csv wrote a file from_csv refuses", std::string(e.what()) + "\n" + back);
  }
  return 0;
}
