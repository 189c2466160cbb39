// Schedules as text: PyTorch's compute-only CSV form (torch.distributed.pipelining writes and
// reads it: one row per pipeline rank, one action a cell, {stage}{F|I|W|B}{micro-batch}, empty
// cells for idle slots, "(a;b)OVERLAP_F_B" for a forward and a backward it overlaps).
#include <cctype>
#include <stdexcept>

#include "schedule/schedule.hpp"
#include "schedule/validate.hpp"

namespace pt::schedule {
namespace {

// One compute action of the file and the cell it came from.
struct Cell {
  int stage = 0;
  Op op = Op::F;
  int mb = 0;
  int row = 0, column = 0; // 0-based
  std::string token;
};

std::string at(int row, int column, const std::string& token) {
  return "row " + std::to_string(row + 1) + " (rank " + std::to_string(row) + "), cell " +
         std::to_string(column + 1) + " '" + token + "'";
}

[[noreturn]] void bad(int row, int column, const std::string& token, const std::string& why) {
  throw std::invalid_argument(at(row, column, token) + ": " + why);
}

std::string trim(const std::string& s) {
  std::size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  std::string t = s.substr(a, b - a);
  if (t.size() >= 2 && t.front() == '"' && t.back() == '"') t = t.substr(1, t.size() - 2);
  return t;
}

// Reads the digits at s[i...]; -1 where there are none (or too many).
int number(const std::string& s, std::size_t& i) {
  const std::size_t from = i;
  long long v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && i - from < 9) {
    v = v * 10 + (s[i++] - '0');
  }
  return i == from || (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])))
             ? -1
             : static_cast<int>(v);
}

// One action token ("3F0", "1I2"); throws naming the cell.
Cell action(const std::string& tok, int row, int column) {
  static const char* const kComm[] = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD"};
  Cell c{0, Op::F, 0, row, column, tok};
  std::size_t i = 0;
  c.stage = number(tok, i);
  const char kind = i < tok.size() ? tok[i] : '\0';
  for (const char* comm : kComm) {
    if (c.stage >= 0 && tok.compare(i, std::string(comm).size(), comm) == 0) {
      bad(row, column, tok,
          "communication is not written in the file: pipetrain adds each message next to "
          "its compute action; keep only the compute cells (F, I, W, B)");
    }
  }
  ++i;
  c.mb = number(tok, i);
  if (c.stage < 0 || c.mb < 0 || i != tok.size() ||
      std::string("FIWB").find(kind) == std::string::npos) {
    bad(row, column, tok,
        "not an action: a cell is {stage}{F|I|W|B}{micro-batch}, e.g. 2F5 (I: backward for the "
        "input, W: for the weights, B: both), \"(a;b)OVERLAP_F_B\", or empty");
  }
  c.op = kind == 'F' ? Op::F : kind == 'I' ? Op::BI : kind == 'W' ? Op::BW : Op::B;
  return c;
}

// The cells of one row, composites split into their parts in order.
void read_row(const std::string& line, int row, std::vector<Cell>& out) {
  const std::string suffix = ")OVERLAP_F_B";
  std::size_t start = 0;
  for (int column = 0; start <= line.size(); ++column) {
    std::size_t end = line.find(',', start);
    if (end == std::string::npos) end = line.size();
    const std::string tok = trim(line.substr(start, end - start));
    start = end + 1;
    if (tok.empty()) continue; // an idle slot
    if (tok.front() == '(' && tok.size() > suffix.size() &&
        tok.compare(tok.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string inner = tok.substr(1, tok.size() - 1 - suffix.size());
      std::size_t from = 0;
      while (from <= inner.size()) {
        std::size_t semi = inner.find(';', from);
        if (semi == std::string::npos) semi = inner.size();
        Cell c = action(trim(inner.substr(from, semi - from)), row, column);
        c.token = tok;
        out.push_back(c);
        from = semi + 1;
      }
    } else {
      out.push_back(action(tok, row, column));
    }
  }
}

// The rank of `stage` in the loop (stage % p) or V placement.
int rank_in(bool vshape, int stage, int p) {
  return vshape && stage >= p ? 2 * p - 1 - stage : stage % p;
}

// The placement the cells use: the V placement where a stage >= p first sits where V puts it
// (and loop placement does not); then every cell must be on its stage's rank.
bool placement(const std::vector<Cell>& cells, int p, int v) {
  bool vshape = false;
  for (const Cell& c : cells) {
    if (v == 2 && c.stage >= p && rank_in(true, c.stage, p) != rank_in(false, c.stage, p)) {
      vshape = c.row == rank_in(true, c.stage, p);
      break;
    }
  }
  for (const Cell& c : cells) {
    const int want = rank_in(vshape, c.stage, p);
    if (c.row != want) {
      bad(c.row, c.column, c.token,
          "stage " + std::to_string(c.stage) + " runs on rank " + std::to_string(want) + " (" +
              (vshape ? "V placement: stage s on rank s for s < pp, on rank 2 pp - 1 - s after"
                      : "loop placement: stage s on rank s % pp") +
              "), not on rank " + std::to_string(c.row));
    }
  }
  return vshape;
}

// The validator names actions by rank and index in the list with messages; a file's author
// knows cells. Rewrites each "rank R action I " into the cell of that action (a message names
// the cell of the compute action it goes with).
std::string in_cells(const std::string& msg, const Schedule& s,
                     const std::vector<std::vector<const Cell*>>& cell_of) {
  std::string out;
  const std::string key = "rank ";
  std::size_t i = 0;
  while (i < msg.size()) {
    const std::size_t k = msg.find(key, i);
    if (k == std::string::npos) break;
    std::size_t j = k + key.size();
    const int r = number(msg, j);
    const std::string mid = " action ";
    std::size_t n = j + mid.size();
    const int a = msg.compare(j, mid.size(), mid) == 0 ? number(msg, n) : -1;
    out += msg.substr(i, k - i);
    if (r < 0 || r >= s.p || a < 0 ||
        static_cast<std::size_t>(a) >= cell_of[static_cast<std::size_t>(r)].size()) {
      out += key;
      i = k + key.size();
      continue;
    }
    const Cell& c = *cell_of[static_cast<std::size_t>(r)][static_cast<std::size_t>(a)];
    out += at(c.row, c.column, c.token);
    i = n;
  }
  out += msg.substr(i);
  const std::string split = "has BI but no BW";
  if (const std::size_t k = out.find(split); k != std::string::npos) {
    out.replace(k, split.size(), "has I (backward for the input) but no W (for the weights)");
  }
  return out;
}

} // namespace

std::string to_csv(const Schedule& s) {
  std::string out;
  for (int r = 0; r < s.p; ++r) {
    std::string row;
    for (const Action& a : s.ranks[static_cast<std::size_t>(r)]) {
      const char* kind = a.op == Op::F    ? "F"
                         : a.op == Op::B  ? "B"
                         : a.op == Op::BI ? "I"
                         : a.op == Op::BW ? "W"
                                          : nullptr;
      if (a.op == Op::STEP) {
        throw std::invalid_argument(s.name + " spans optimizer steps: it has no CSV form");
      }
      if (kind == nullptr) continue; // messages: the reader adds them again
      row += (row.empty() ? "" : ",") + std::to_string(s.stage_of(r, a.chunk)) + kind +
             std::to_string(a.mb);
    }
    out += row + "\n";
  }
  return out;
}

Schedule from_csv(const std::string& text, int p, int m, int v) {
  std::vector<Cell> cells;
  std::vector<std::string> lines;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
    start = end + 1;
  }
  while (!lines.empty() && trim(lines.back()).empty()) lines.pop_back();
  if (static_cast<int>(lines.size()) != p) {
    throw std::invalid_argument(
        "the file has " + std::to_string(lines.size()) +
        " rows; it needs one per pipeline rank: parallel.pp = " + std::to_string(p));
  }
  for (int r = 0; r < p; ++r) read_row(lines[static_cast<std::size_t>(r)], r, cells);
  for (const Cell& c : cells) {
    if (c.stage >= p * v) {
      bad(c.row, c.column, c.token,
          "stage " + std::to_string(c.stage) +
              " does not exist: pp * virtual_stages = " + std::to_string(p * v) + " stages");
    }
    if (c.mb >= m) {
      bad(c.row, c.column, c.token,
          "micro-batch " + std::to_string(c.mb) + " does not exist: a step has " +
              std::to_string(m) + " (0.." + std::to_string(m - 1) + ")");
    }
  }
  Schedule s;
  s.name = "file";
  s.p = p;
  s.m = m;
  s.v = v;
  s.vshape = placement(cells, p, v);
  s.ranks.resize(static_cast<std::size_t>(p));
  for (const Cell& c : cells) {
    const int chunk = s.vshape ? (c.stage >= p ? 1 : 0) : c.stage / p;
    s.ranks[static_cast<std::size_t>(c.row)].push_back({c.op, c.mb, chunk});
  }
  add_communication(s);
  // which cell each action of the lists goes with: a message with its compute action
  std::vector<std::vector<const Cell*>> cell_of(static_cast<std::size_t>(p));
  std::size_t next = 0;
  for (int r = 0; r < p; ++r) {
    const Cell* last = nullptr;
    for (const Action& a : s.ranks[static_cast<std::size_t>(r)]) {
      const bool compute = a.op == Op::F || a.op == Op::B || a.op == Op::BI || a.op == Op::BW;
      if (compute) last = &cells[next++];
      const bool before = a.op == Op::RECV_ACT || a.op == Op::RECV_GRAD;
      cell_of[static_cast<std::size_t>(r)].push_back(before ? &cells[next] : last);
    }
  }
  const Validation check = validate(s);
  if (!check.ok) throw std::invalid_argument(in_cells(check.error, s, cell_of));
  return s;
}

} // namespace pt::schedule
