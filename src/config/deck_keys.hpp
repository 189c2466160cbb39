// The deck as one table: every key's section, name, type, default, range or choices, one line of
// documentation and its status. Parsing (parse_deck), the unknown-key check with its
// suggestions, the resolved deck printed at startup and the key reference of docs/deck.md
// (`pipetrain keys`; a test compares the two) all come from it. Defaults are RunConfig's member
// initializers, so a RunConfig made in code starts where an empty deck does.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "config/deck_reader.hpp"
#include "config/run_config.hpp"

namespace pt {

struct DeckKey {
  std::string section, name;
  std::string type;   // as docs/deck.md shows it: int, float, bool, string, ...
  std::string def;    // the default as docs/deck.md shows it ("required", a value, a rule)
  std::string range;  // the range or the choices
  std::string doc;    // one line: what the key does
  std::string status; // "yes" (implemented and tested) or what limits it
  // Reads the key into the config: its value, or its default where the deck has none (then
  // also written into the deck, for the resolved text). Range and type errors name the key.
  std::function<void(DeckReader&, RunConfig&)> read;
  // The key's value in a config, as the deck spells it (numbers exact), for comparisons.
  std::function<std::string(const RunConfig&)> value;
};

// Every key, in the order of docs/deck.md: [model], [parallel], [train], [data], [checkpoint],
// [comm], [device], [log], [runtime]. Keys read after others depend on them (min_lr on lr).
const std::vector<DeckKey>& deck_keys();

// What makes two models the same model: every [model] key of the table with its value, derived
// values resolved (n_kv_head, ffn_hidden, tie_embeddings) and llama's keys at their defaults for
// gpt2, where they do nothing; the [moe] keys that shape the model ("moe.experts", ...; at their
// defaults for a dense model). A checkpoint resumes only under an equal description.
std::vector<std::pair<std::string, std::string>> model_description(const ModelConfig& m);

// Section -> its key names, for the unknown-key check.
std::map<std::string, std::vector<std::string>> deck_sections();

// The key reference: per section a heading and a Markdown table, as docs/deck.md holds it.
std::string deck_keys_markdown();

} // namespace pt
