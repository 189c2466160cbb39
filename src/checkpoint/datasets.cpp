#include "checkpoint/datasets.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace pt::ckpt {

namespace fs = std::filesystem;

std::string step_file(int step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08d.h5", step);
  return buf;
}

ParamLayout whole_layout(const ModelConfig& m) {
  return ParamLayout(m, StageSpec{true, true, 0, m.n_layer});
}

std::vector<Local> locals(Shards& s, const ParamTensor& whole) {
  std::vector<Local> out;
  for (std::size_t c = 0; c < s.stages.size(); ++c) {
    const ParamLayout& lay = s.stages[c]->layout();
    const ParamTensor* t = lay.find(whole.role, whole.layer);
    if (t == nullptr) continue;
    out.push_back({s.stages[c], s.opts[c], t, static_cast<std::size_t>(t - lay.tensors().data()),
                   s.older != nullptr ? (*s.older)[c].data() : nullptr, c, s.snapshot});
  }
  return out;
}

std::vector<Slice> slices(const Local& l, int sec) {
  Snapshot* snap = l.snapshot;
  if (sec == 0 || sec == 3) {
    float* base = snap == nullptr ? (sec == 0 ? l.stage->params() : l.older)
                                  : (sec == 0 ? snap->params : snap->older)[l.chunk].data();
    return {Slice{0, l.t->size, base + l.t->offset}};
  }
  std::vector<Slice> out;
  for (const Optimizer::Run& r :
       snap == nullptr ? l.opt->runs(l.index) : snap->runs[l.chunk][l.index]) {
    out.push_back({r.begin, r.size, sec == 1 ? r.m : r.v});
  }
  return out;
}

bool writes(const Local& l, int sec, const Layout& layout, const std::vector<int>& turns,
            std::size_t k) {
  if (!l.stage->counts_in_norm(*l.t)) return false;
  // an expert-parallel shard: written by each rank of one expert-parallel group
  const int dp = layout.coords().dp, ep = layout.ep();
  if (l.t->expert) return dp / ep == turns[k] / ep;
  return dp == turns[k] || ((sec == 1 || sec == 2) && l.opt->sharded());
}

namespace {

// Adds elements [b, e) of the block at[0..d) of a dataset of dims (row-major) to the selection:
// the whole indices of dimension d as one hyperslab, the partial ones at either end by recursion.
void select_run(hid_t space, const std::vector<hsize_t>& dims, std::size_t d,
                std::vector<hsize_t>& at, hsize_t b, hsize_t e, bool& first) {
  const auto add = [&](hsize_t from, hsize_t n) { // indices [from, from + n) of dimension d
    std::vector<hsize_t> start(dims.size(), 0), count(dims);
    for (std::size_t k = 0; k < d; ++k) start[k] = at[k], count[k] = 1;
    start[d] = from;
    count[d] = n;
    H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                        count.data(), nullptr);
    first = false;
  };
  if (d + 1 == dims.size()) return add(b, e - b);
  hsize_t inner = 1;
  for (std::size_t k = d + 1; k < dims.size(); ++k) inner *= dims[k];
  const hsize_t i0 = b / inner, i1 = (e - 1) / inner;
  if (i0 == i1 && (b % inner != 0 || e % inner != 0)) { // inside one index
    at[d] = i0;
    return select_run(space, dims, d + 1, at, b - i0 * inner, e - i0 * inner, first);
  }
  hsize_t whole_begin = i0, whole_end = i1 + 1;
  if (b % inner != 0) { // the head
    at[d] = i0;
    select_run(space, dims, d + 1, at, b % inner, inner, first);
    whole_begin = i0 + 1;
  }
  if (e % inner != 0) whole_end = i1;
  if (whole_end > whole_begin) add(whole_begin, whole_end - whole_begin);
  if (e % inner != 0) { // the tail
    at[d] = i1;
    select_run(space, dims, d + 1, at, 0, e % inner, first);
  }
}

} // namespace

void select_slice(hid_t space, const Local& l, const Slice& s, const Layout& layout) {
  const ParamTensor& t = *l.t;
  if (s.whole(t)) return select_shard(space, t, layout.coords().tp, layout.tp());
  if (t.global_shape.size() > 2) { // stacked experts: local order is global from first_expert
    const std::vector<hsize_t> dims = dims_of(t);
    std::vector<hsize_t> at(dims.size(), 0);
    bool first = true;
    const hsize_t at0 = l.stage->layout().global_index(t, 0);
    select_run(space, dims, 0, at, at0 + s.begin, at0 + s.begin + s.size, first);
    if (first) H5Sselect_none(space);
    return;
  }
  const ParamLayout& lay = l.stage->layout();
  const bool two_d = t.global_shape.size() > 1;
  const std::size_t gcols = two_d ? static_cast<std::size_t>(t.global_shape[1]) : 1;
  const std::size_t lcols = two_d ? static_cast<std::size_t>(t.shape[1]) : 1;
  // the run row by row (local rows are contiguous in the global tensor), rows that continue the
  // previous rectangle's columns merged into it; local order is global order
  hsize_t rect[4] = {0, 0, 0, 0}; // first row, rows, first column, columns
  bool first = true, open = false;
  auto flush = [&] {
    const hsize_t start[2] = {rect[0], rect[2]}, count[2] = {rect[1], rect[3]};
    H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, count,
                        nullptr);
    first = false;
  };
  for (std::size_t i = s.begin; i < s.begin + s.size;) {
    const std::size_t end = std::min(s.begin + s.size, (i / lcols + 1) * lcols);
    const std::size_t g = lay.global_index(t, i);
    const hsize_t row = g / gcols, col = g % gcols, cols = end - i;
    if (open && rect[2] == col && rect[3] == cols && rect[0] + rect[1] == row) {
      ++rect[1];
    } else {
      if (open) flush();
      rect[0] = row, rect[1] = 1, rect[2] = col, rect[3] = cols;
      open = true;
    }
    i = end;
  }
  if (open) flush();
  if (first) H5Sselect_none(space);
}

std::vector<hsize_t> dims_of(const ParamTensor& t) {
  return std::vector<hsize_t>(t.global_shape.begin(), t.global_shape.end());
}

void select_shard(hid_t space, const ParamTensor& t, int tp_rank, int tp) {
  const std::vector<hsize_t> g = dims_of(t);
  std::vector<hsize_t> start(std::max<std::size_t>(g.size(), 2), 0), count(start.size(), 1);
  for (std::size_t d = 0; d < g.size(); ++d) count[d] = g[d];
  if (t.expert) { // this rank's experts
    count[0] = static_cast<hsize_t>(t.shape[0]);
    start[0] = static_cast<hsize_t>(t.first_expert);
  }
  if (t.shard_dim == 1) {
    count[1] = g[1] / static_cast<hsize_t>(tp);
    start[1] = static_cast<hsize_t>(tp_rank) * count[1];
  }
  if (t.shard_dim != 0) {
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    return;
  }
  // rows: this rank's share of every part, in order
  hsize_t first = 0;
  for (std::size_t p = 0; p < t.part_rows.size(); ++p) {
    count[0] = static_cast<hsize_t>(t.part_rows[p]) / static_cast<hsize_t>(tp);
    start[0] = first + static_cast<hsize_t>(tp_rank) * count[0];
    H5Sselect_hyperslab(space, p == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                        count.data(), nullptr);
    first += static_cast<hsize_t>(t.part_rows[p]);
  }
}

std::vector<std::string> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    int step = 0;
    char tail[8] = {0};
    if (std::sscanf(n.c_str(), "step_%d.h%2s", &step, tail) == 2 && n.size() == 16 &&
        n.compare(n.size() - 3, 3, ".h5") == 0) {
      found.push_back({step, e.path().string()});
    }
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::uint64_t slice_checksum(const ParamLayout& lay, const ParamTensor& t, const float* x,
                             std::size_t begin, std::size_t n) {
  constexpr std::uint64_t kIndex = 0x9E3779B97F4A7C15ULL, kMix = 0xBF58476D1CE4E5B9ULL;
  std::uint64_t sum = 0;
  // by runs of consecutive global indices g, so that g * kIndex is a running sum
  for (std::size_t i = begin; i < begin + n;) {
    const std::size_t run = std::min(begin + n - i, lay.run_from(t, i));
    const float* p = x + (i - begin);
    std::uint64_t gk = lay.global_index(t, i) * kIndex;
    for (std::size_t j = 0; j < run; ++j, gk += kIndex) {
      std::uint32_t bits;
      std::memcpy(&bits, p + j, sizeof bits);
      // for a fixed position the term is a bijection of the bits: a changed element changes it
      const std::uint64_t term = (bits + gk) * kMix;
      sum += term ^ (term >> 29);
    }
    i += run;
  }
  return sum;
}

std::vector<int> dp_turns(const ParamLayout& whole, int dp) {
  std::vector<std::size_t> load(static_cast<std::size_t>(dp), 0);
  std::vector<int> turn;
  for (const ParamTensor& t : whole.tensors()) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    turn.push_back(static_cast<int>(least));
    load[static_cast<std::size_t>(least)] += t.size;
  }
  return turn;
}

std::string dataset_name(int sec, const ParamTensor& t) {
  return std::string("/") + kSections[sec] + "/" + t.name;
}

} // namespace pt::ckpt
