#include "config/deck_reader.hpp"

namespace pt {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

} // namespace

std::string rename_keys(toml::table& root) {
  // device.blas_threads set the BLAS's threads; device.threads sets Kokkos' and the BLAS's
  toml::table* device = root.get_as<toml::table>("device");
  if (device == nullptr || !device->contains("blas_threads")) return {};
  if (!device->contains("threads")) {
    device->get("blas_threads")->visit([device](auto&& v) { device->insert("threads", v); });
  }
  device->erase("blas_threads");
  return "warning: device.blas_threads is now called device.threads; read as that\n";
}

std::string suggestion(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = 3; // only suggest close matches
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(name, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best.empty() ? std::string() : "; did you mean '" + best + "'?";
}

std::string describe(const toml::node& n) {
  std::ostringstream os;
  if (n.is_string()) {
    os << '"' << n.value<std::string>().value_or("") << '"';
  } else if (n.is_array()) {
    os << *n.as_array();
  } else if (n.is_table()) {
    os << "a table";
  } else if (n.is_integer()) {
    os << n.value<std::int64_t>().value_or(0);
  } else if (n.is_floating_point()) {
    os << n.value<double>().value_or(0.0);
  } else if (n.is_boolean()) {
    os << (n.value<bool>().value_or(false) ? "true" : "false");
  } else {
    os << "a value";
  }
  return os.str();
}

namespace {

// Whether s is well-formed UTF-8: no stray continuation byte, no overlong form, no surrogate,
// nothing past U+10FFFF.
bool is_utf8(const std::string& s) {
  static constexpr std::uint32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000}; // by sequence length
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t len = c < 0x80           ? 1
                            : (c >> 5) == 0x6  ? 2
                            : (c >> 4) == 0xE  ? 3
                            : (c >> 3) == 0x1E ? 4
                                               : 0;
    if (len == 0 || i + len > s.size()) return false;
    std::uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
    for (std::size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if (cp < kLeast[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

} // namespace

void apply_override(toml::table& root, const std::string& arg, std::set<std::string>& overridden) {
  const auto eq = arg.find('=');
  const std::string name = arg.substr(0, eq);
  const auto dot = name.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == name.size() ||
      name.find('.', dot + 1) != std::string::npos) {
    throw input_error("command-line argument '" + arg +
                      "' is not an override: expected section.key=value, for example "
                      "train.steps=200");
  }
  const std::string sec = name.substr(0, dot);
  const std::string key = name.substr(dot + 1);
  const std::string text = arg.substr(eq + 1);
  if (text.empty()) {
    throw input_error("command-line override " + name + " has no value: expected " + name +
                      "=VALUE");
  }

  toml::table parsed;
  bool is_toml = true;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    is_toml = false;
  }
  toml::node* s = root.get(sec);
  if (s == nullptr) {
    root.insert(sec, toml::table{});
    s = root.get(sec);
  }
  if (!s->is_table()) {
    throw input_error("command-line override " + name + ": '" + sec + "' is not a section");
  }
  if (is_toml && parsed.get("v") != nullptr) {
    parsed.get("v")->visit([&](auto&& v) { s->as_table()->insert_or_assign(key, v); });
  } else {
    if (!is_utf8(text)) {
      throw input_error("command-line override " + name +
                        " = a value that is not UTF-8 text: a deck is UTF-8 (TOML), so the "
                        "resolved deck pipetrain prints and saves could not hold it; give a UTF-8 "
                        "value (for a path: rename the file)");
    }
    s->as_table()->insert_or_assign(key, text);
  }
  overridden.insert(name);
}

} // namespace pt
