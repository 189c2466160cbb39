// Reading a TOML deck: typed values with their ranges and defaults (DeckReader), the
// command-line overrides, and the nearest-name suggestions of the error messages. The keys
// themselves are the table of config/deck_keys.hpp.
#pragma once

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "util/errors.hpp"

namespace pt {

// Moves renamed keys of a deck to their current names (a checkpoint's saved deck, or a user's,
// may hold an old one); returns a warning for each moved, else "".
std::string rename_keys(toml::table& root);

// "; did you mean 'X'?" for the candidate nearest to name (edit distance under 3), else "".
std::string suggestion(const std::string& name, const std::vector<std::string>& candidates);

// A TOML value as an error message shows it.
std::string describe(const toml::node& n);

// "section.key=value" applied to the parsed deck; a value that is not valid TOML is taken as a
// bare string, so data.path=data/x.bin needs no quotes. Records the key in `overridden`.
void apply_override(toml::table& root, const std::string& arg, std::set<std::string>& overridden);

// Reads typed values out of the parsed deck, remembering which keys were used and filling in
// defaults so the resolved deck can be printed and stored.
class DeckReader {
public:
  DeckReader(toml::table& root, std::string path, std::set<std::string> overridden)
      : root_(root), path_(std::move(path)), overridden_(std::move(overridden)) {}

  std::string where(const std::string& sec, const std::string& key) const {
    const std::string full = sec + "." + key;
    if (overridden_.count(full)) return "command-line override " + full;
    if (const toml::node* n = find(sec, key)) {
      return path_ + ":" + std::to_string(n->source().begin.line) + ": " + full;
    }
    return path_ + ": " + full;
  }

  [[noreturn]] void fail(const std::string& sec, const std::string& key,
                         const std::string& what) const {
    throw input_error(where(sec, key) + " " + what);
  }

  std::int64_t get_int(const std::string& sec, const std::string& key,
                       std::optional<std::int64_t> def, std::int64_t lo, std::int64_t hi) {
    const toml::node* n = use(sec, key);
    if (n == nullptr) {
      if (!def)
        missing(sec, key, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      set_default(sec, key, toml::value<std::int64_t>(*def));
      return *def;
    }
    if (!n->is_integer()) {
      fail(sec, key,
           "= " + describe(*n) + " must be an integer (for example " +
               std::to_string(std::max<std::int64_t>(lo, 1)) + ")");
    }
    const std::int64_t v = *n->value<std::int64_t>();
    if (v < lo || v > hi) {
      fail(sec, key,
           "= " + std::to_string(v) + " is out of range: expected an integer in [" +
               std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return v;
  }

  double get_double(const std::string& sec, const std::string& key, std::optional<double> def,
                    double lo, double hi, bool lo_open = false) {
    const toml::node* n = use(sec, key);
    if (n == nullptr) {
      if (!def) missing(sec, key, "a number");
      set_default(sec, key, toml::value<double>(*def));
      return *def;
    }
    double v = 0.0;
    if (n->is_floating_point()) {
      v = *n->value<double>();
    } else if (n->is_integer()) {
      v = static_cast<double>(*n->value<std::int64_t>());
    } else {
      fail(sec, key, "= " + describe(*n) + " must be a number (for example 0.001)");
    }
    const bool below = lo_open ? !(v > lo) : !(v >= lo);
    if (!std::isfinite(v) || below || v > hi) {
      std::ostringstream os;
      os << "= " << v << " is out of range: expected a number in " << (lo_open ? "(" : "[") << lo
         << ", " << hi << "]";
      fail(sec, key, os.str());
    }
    return v;
  }

  bool get_bool(const std::string& sec, const std::string& key, bool def) {
    const toml::node* n = use(sec, key);
    if (n == nullptr) {
      set_default(sec, key, toml::value<bool>(def));
      return def;
    }
    if (!n->is_boolean()) fail(sec, key, "= " + describe(*n) + " must be true or false");
    return *n->value<bool>();
  }

  std::string get_string(const std::string& sec, const std::string& key,
                         std::optional<std::string> def,
                         const std::vector<std::string>& allowed = {}) {
    const toml::node* n = use(sec, key);
    if (n == nullptr) {
      if (!def) missing(sec, key, "a string");
      set_default(sec, key, toml::value<std::string>(*def));
      return *def;
    }
    if (!n->is_string()) fail(sec, key, "= " + describe(*n) + " must be a string in quotes");
    const std::string v = *n->value<std::string>();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : "|") + a;
      fail(sec, key, "= \"" + v + "\" is not one of " + list + suggestion(v, allowed));
    }
    return v;
  }

  // A string key naming one of `values` (spelled as name() gives them), as its enum.
  template <class E>
  E get_enum(const std::string& sec, const std::string& key, E def,
             std::initializer_list<E> values) {
    std::vector<std::string> allowed;
    for (E v : values) allowed.push_back(name(v));
    const std::string s = get_string(sec, key, std::string(name(def)), allowed);
    for (E v : values) {
      if (s == name(v)) return v;
    }
    return def; // not reached: get_string accepts only `allowed`
  }

  const toml::node* raw(const std::string& sec, const std::string& key) { return use(sec, key); }
  bool has_section(const std::string& sec) const { return root_.get(sec) != nullptr; }

  // Unknown sections and keys are errors, with the nearest known name as a hint.
  void reject_unknown(const std::map<std::string, std::vector<std::string>>& known) const {
    std::vector<std::string> sections;
    for (const auto& [s, keys] : known) sections.push_back(s);
    for (auto&& [sk, snode] : root_) {
      const std::string sec(sk.str());
      auto it = known.find(sec);
      if (it == known.end()) {
        throw input_error(path_ + ":" + std::to_string(snode.source().begin.line) +
                          ": unknown section [" + sec + "]" + suggestion(sec, sections) +
                          " (sections: model parallel train data checkpoint comm device log "
                          "runtime)");
      }
      if (!snode.is_table()) {
        throw input_error(path_ + ":" + std::to_string(snode.source().begin.line) + ": '" + sec +
                          "' must be a [" + sec + "] section, not a value");
      }
      for (auto&& [k, node] : *snode.as_table()) {
        const std::string key(k.str());
        if (std::find(it->second.begin(), it->second.end(), key) == it->second.end()) {
          throw input_error(where(sec, key) + " is not a known key of [" + sec + "]" +
                            suggestion(key, it->second) + " (see docs/deck.md)");
        }
      }
    }
  }

private:
  const toml::node* find(const std::string& sec, const std::string& key) const {
    const toml::node* s = root_.get(sec);
    if (s == nullptr || !s->is_table()) return nullptr;
    return s->as_table()->get(key);
  }
  const toml::node* use(const std::string& sec, const std::string& key) { return find(sec, key); }
  [[noreturn]] void missing(const std::string& sec, const std::string& key,
                            const std::string& expected) const {
    throw input_error(path_ + ": missing required key " + sec + "." + key + " (" + expected +
                      "): add it under [" + sec + "] or pass " + sec + "." + key +
                      "=VALUE on the command line");
  }
  template <class V> void set_default(const std::string& sec, const std::string& key, V&& v) {
    toml::node* s = root_.get(sec);
    if (s == nullptr) {
      root_.insert(sec, toml::table{});
      s = root_.get(sec);
    }
    if (s->is_table()) s->as_table()->insert(key, std::forward<V>(v));
  }

  toml::table& root_;
  std::string path_;
  std::set<std::string> overridden_;
};

} // namespace pt
