// libFuzzer target: token files (llm.c's layout) through pt::TokenFile, the header and token
// checks every run makes before training (docs/fuzzing.md).
//
// Input: the file's bytes. They are written to a temporary file and opened for three models
// (vocabulary, tokens one sequence needs). A rejected file must raise pt::Error(bad_input); an
// accepted one must hold at least that many tokens, each below the vocabulary size, and every
// token it exposes is read.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "data/token_file.hpp"
#include "util/errors.hpp"

namespace {

// PT_FUZZ_VERBOSE=1: each input's verdict on stderr (to see what a reproducer does)
bool verbose() {
  static const bool on = std::getenv("PT_FUZZ_VERBOSE") != nullptr;
  return on;
}

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_token_file: %s\n%s\n", what, detail.c_str());
  std::abort();
}

std::string temp_path() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/pt-fuzz-tokens-" +
         std::to_string(::getpid()) + ".bin";
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = temp_path();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
    finding("cannot write the temporary file", path);
  }
  struct Model {
    int vocab_size, min_tokens;
  };
  // byte-level (seq_len 8), GPT-2's vocabulary (seq_len 1024), the largest vocabulary the deck
  // accepts
  for (const Model m : {Model{256, 9}, Model{50257, 1025}, Model{65536, 1}}) {
    try {
      const pt::TokenFile tf(path, m.vocab_size, m.min_tokens);
      if (verbose()) std::fprintf(stderr, "accepted: %zu tokens\n", tf.size());
      if (tf.size() < static_cast<std::size_t>(m.min_tokens)) {
        finding("accepted a file with too few tokens", std::to_string(tf.size()));
      }
      for (std::size_t i = 0; i < tf.size(); ++i) {
        if (tf.tokens()[i] >= m.vocab_size) {
          finding("accepted a token outside the vocabulary", std::to_string(tf.tokens()[i]));
        }
      }
    } catch (const pt::Error& e) {
      if (verbose()) std::fprintf(stderr, "rejected: %s\n", e.what());
      if (e.code() != pt::ExitCode::bad_input)
        finding("pt::Error with a code other than 2", e.what());
    }
  }
  ::unlink(path.c_str());
  return 0;
}
