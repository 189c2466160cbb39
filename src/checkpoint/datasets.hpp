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
  AdamW* opt;
  const ParamTensor* t;
  float* older; // 2bw's older weights of the chunk, or null
  float* base(int section) const {
    switch (section) {
    case 0:
      return stage->params();
    case 1:
      return opt->m();
    case 2:
      return opt->v();
    default:
      return older;
    }
  }
};

std::vector<Local> locals(Shards& s, const std::string& name);

std::vector<hsize_t> dims_of(const ParamTensor& t);

// Selects this rank's tensor-parallel shard of the global dataspace (see ParamTensor).
void select_shard(hid_t space, const ParamTensor& t, int tp_rank, int tp);

// Checkpoints in dir, newest step first (published files only, never .partial).
std::vector<std::string> list_checkpoints(const std::filesystem::path& dir);

// A checksum that slices can compute separately: the sum (mod 2^64) over elements of a mixed
// term of (index in the whole tensor, float bits). Any single changed element changes it; ranks
// add their slices' sums. Cheap enough (a multiply and a shift per element) not to dominate I/O.
std::uint64_t slice_checksum(const ParamLayout& lay, const ParamTensor& t, const float* x);

// Which data-parallel replica writes (and verifies) each tensor: greedy by size, so the replicas
// share the bytes evenly. The same answer on every rank.
std::vector<int> dp_turns(const ParamLayout& whole, int dp);

// The dataset of tensor `t` in section `sec` ("/model/wte", "/optim/m/wte", ...).
std::string dataset_name(int sec, const ParamTensor& t);

// The rank that writes (and checks) tensor k of the whole model: the owning stage, each tp shard
// (replicated tensors from tp rank 0), and one data-parallel replica, taking turns by tensor.
const Local* writer_of(const std::vector<Local>& mine, const Layout& layout,
                       const std::vector<int>& turns, std::size_t k);

} // namespace pt::ckpt
