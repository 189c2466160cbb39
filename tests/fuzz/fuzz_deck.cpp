// libFuzzer target: the input deck through parse_deck, the parse + validate path load_deck runs on
// every rank, with command-line overrides (docs/fuzzing.md).
//
// Input: the deck text; a first line "#np=N" (a TOML comment) sets the job's rank count (1
// without it); a line "%%" ends the deck, and each line after it is one `section.key=value`
// override. Bad input must end in pt::Error(bad_input), the documented path; any other exception,
// a sanitizer report or a hang is a finding. An accepted deck must fit the job, and its resolved
// text (printed at startup, "can be saved and rerun as is") must parse again to itself.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "config/run_config.hpp"
#include "fuzz_common.hpp"
#include "util/errors.hpp"

namespace {

struct Input {
  std::string deck;
  std::vector<std::string> overrides;
  int world_size = 1;
};

Input split(std::string_view in) {
  Input out;
  if (in.substr(0, 4) == "#np=") {
    long long np = 0;
    std::size_t i = 4;
    for (; i < in.size() && i < 12 && in[i] >= '0' && in[i] <= '9'; ++i) np = np * 10 + in[i] - '0';
    out.world_size = static_cast<int>(np < 1 ? 1 : (np > (1 << 20) ? (1 << 20) : np));
  }
  std::size_t pos = 0;
  std::size_t cut = std::string_view::npos;
  while (pos <= in.size()) {
    const std::size_t end = std::min(in.find('\n', pos), in.size());
    if (in.substr(pos, end - pos) == "%%") {
      cut = pos;
      pos = end + 1;
      break;
    }
    pos = end + 1;
  }
  if (cut == std::string_view::npos) {
    out.deck = std::string(in);
    return out;
  }
  out.deck = std::string(in.substr(0, cut));
  while (pos < in.size()) {
    const std::size_t end = std::min(in.find('\n', pos), in.size());
    out.overrides.emplace_back(in.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// parse_deck's result, or the empty optional when it rejected the deck as documented
bool parse(const std::string& text, const std::vector<std::string>& overrides, int world_size,
           pt::RunConfig& out) {
  try {
    out = pt::parse_deck(text, "fuzz.toml", overrides, world_size);
    if (fuzz::verbose()) std::fprintf(stderr, "accepted:\n%s\n", out.resolved_text.c_str());
    return true;
  } catch (const pt::Error& e) {
    fuzz::rejected(e);
    if (std::string_view(e.what()).empty()) fuzz::finding("pt::Error without a message", "");
    return false;
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Input in = split(std::string_view(reinterpret_cast<const char*>(data), size));
  pt::RunConfig c;
  if (!parse(in.deck, in.overrides, in.world_size, c)) return 0;

  const pt::ParallelConfig& p = c.parallel;
  if (static_cast<long long>(p.pp) * p.dp * p.tp != in.world_size) {
    fuzz::finding("accepted a layout that does not fit the job", c.resolved_text);
  }
  if (p.micro_batches < 1 || p.micro_batches != c.accumulation() ||
      static_cast<long long>(p.micro_batches) * p.dp * c.train.micro_batch !=
          c.train.global_batch) {
    fuzz::finding("accepted batch sizes that do not split", c.resolved_text);
  }
  pt::RunConfig again;
  if (!parse(c.resolved_text, {}, in.world_size, again)) {
    fuzz::finding("the resolved deck does not parse again", c.resolved_text);
  }
  if (again.resolved_text != c.resolved_text) {
    fuzz::finding("the resolved deck does not resolve to itself",
                  c.resolved_text + "\n---- resolved again ----\n" + again.resolved_text);
  }
  return 0;
}
