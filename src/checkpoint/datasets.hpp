// Internal to checkpoint/: how the model's tensors map to a checkpoint file's datasets (names,
// global shapes, tensor-parallel shards, which rank writes each, slice checksums) and how
// checkpoint files are named and listed. write.cpp and read.cpp share it.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace pt::ckpt {

inline const char* const kSections[] = {"model", "optim/m", "optim/v", "model_prev"};

std::string step_file(int step);

// The whole model's tensors, in the order the file lists them.
ParamLayout whole_layout(const ModelConfig& m);

// This rank's copies of a tensor (a rank may hold none, or two with tied wte on two chunks).
struct Local {
  GptStage* stage;
  Optimizer* opt;
  const ParamTensor* t;
  std::size_t index;  // t's index in the chunk's layout
  float* older;       // 2bw's older weights of the chunk, or null
  std::size_t chunk;  // the chunk's index in the shards
  Snapshot* snapshot; // the copy to write instead of the live buffers, or null
};

std::vector<Local> locals(Shards& s, const ParamTensor& whole);

// A run of a copy's elements in one section: local elements [begin, begin + size) of the tensor
// (its tp shard's flat order), at data in the chunk's backend memory.
struct Slice {
  std::size_t begin = 0, size = 0;
  float* data = nullptr;
  bool whole(const ParamTensor& t) const { return begin == 0 && size == t.size; }
};

// The slices of l in section sec: the whole tensor for the weights (sections 0 and 3), the
// optimizer's runs for its moments (1 and 2: the whole tensor, or ZeRO-1's pieces); from the
// snapshot where l has one (host memory).
std::vector<Slice> slices(const Local& l, int sec);

// Whether this rank writes (and checks) section sec of tensor k from l: the owning stage, each tp
// shard (replicated tensors from tp rank 0), and one data-parallel replica, taking turns by
// tensor (of expert-parallel shards: each rank of one expert-parallel group); of a sharded
// (ZeRO-1) optimizer's moments every dp rank its own runs.
bool writes(const Local& l, int sec, const Layout& layout, const std::vector<int>& turns,
            std::size_t k);

// Selects in the dataset's space the elements of slice s of l's tensor: the whole tp shard
// (select_shard), or a run's rows as rectangles of the global shape.
void select_slice(hid_t space, const Local& l, const Slice& s, const Layout& layout);

std::vector<hsize_t> dims_of(const ParamTensor& t);

// Selects this rank's tensor-parallel shard of the global dataspace (see ParamTensor).
void select_shard(hid_t space, const ParamTensor& t, int tp_rank, int tp);

// Checkpoints in dir, newest step first (published files only, never .partial).
std::vector<std::string> list_checkpoints(const std::filesystem::path& dir);

// A checksum that slices can compute separately: the sum (mod 2^64) over elements of a mixed
// term of (index in the whole tensor, float bits). Any single changed element changes it; ranks
// add their slices' sums. Cheap enough (a multiply and a shift per element) not to dominate I/O.
// x holds local elements [begin, begin + n) of t.
std::uint64_t slice_checksum(const ParamLayout& lay, const ParamTensor& t, const float* x,
                             std::size_t begin, std::size_t n);

// Which data-parallel replica writes (and verifies) each tensor: greedy by size, so the replicas
// share the bytes evenly. The same answer on every rank.
std::vector<int> dp_turns(const ParamLayout& whole, int dp);

// The dataset of tensor `t` in section `sec` ("/model/wte", "/optim/m/wte", ...).
std::string dataset_name(int sec, const ParamTensor& t);

} // namespace pt::ckpt
