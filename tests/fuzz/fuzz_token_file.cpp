// libFuzzer target: token files (llm.c's layout) through pt::TokenFile, the header and token
// checks every run makes before training (docs/fuzzing.md).
//
// Input: the file's bytes. They are written to a temporary file and opened for three models
// (vocabulary, tokens one sequence needs). A rejected file must raise pt::Error(bad_input); an
// accepted one must hold at least that many tokens, each below the vocabulary size, and every
// token it exposes is read.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "data/token_file.hpp"
#include "fuzz_common.hpp"
#include "util/errors.hpp"

namespace {} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = fuzz::temp_path("tokens", ".bin");
  fuzz::write_input(path, data, size);
  struct Model {
    int vocab_size, min_tokens;
  };
  // byte-level (seq_len 8), GPT-2's vocabulary (seq_len 1024), the largest vocabulary the deck
  // accepts
  for (const Model m : {Model{256, 9}, Model{50257, 1025}, Model{65536, 1}}) {
    try {
      const pt::TokenFile tf(path, m.vocab_size, m.min_tokens);
      if (fuzz::verbose()) std::fprintf(stderr, "accepted: %zu tokens\n", tf.size());
      if (tf.size() < static_cast<std::size_t>(m.min_tokens)) {
        fuzz::finding("accepted a file with too few tokens", std::to_string(tf.size()));
      }
      for (std::size_t i = 0; i < tf.size(); ++i) {
        if (tf.at(i) >= static_cast<std::uint32_t>(m.vocab_size)) {
          fuzz::finding("accepted a token outside the vocabulary", std::to_string(tf.at(i)));
        }
      }
    } catch (const pt::Error& e) {
      fuzz::rejected(e);
    }
  }
  ::unlink(path.c_str());
  return 0;
}
