// libFuzzer target: calibration files (`pipetrain-bench calibrate`, comm.calibration) through
// pt::load_calibration, and the model that chooses an all-reduce from them (docs/fuzzing.md).
//
// Input: the file's bytes, written to a temporary file. A rejected file must raise
// pt::Error(bad_input). An accepted one is used as the runtime uses it: choose_algorithm and
// modelled_time for a spread of message sizes and groups; every modelled time must be a finite,
// non-negative number of seconds, and the choice one of the modelled algorithms.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/topology.hpp"
#include "fuzz_common.hpp"
#include "util/errors.hpp"

namespace {} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = fuzz::temp_path("calibration", ".toml");
  fuzz::write_input(path, data, size);
  pt::Topology t;
  try {
    t = pt::load_calibration(path);
  } catch (const pt::Error& e) {
    fuzz::rejected(e);
    ::unlink(path.c_str());
    return 0;
  }
  ::unlink(path.c_str());
  if (fuzz::verbose()) std::fprintf(stderr, "accepted:\n%s", pt::calibration_toml(t, "").c_str());

  const auto& algos = pt::modelled_algorithms();
  // bytes: one float up to a 1 GiB bucket; groups: 2 ranks, odd, power of two, two nodes of
  // unequal size, many nodes
  for (const double bytes : {4.0, 4096.0, 1048576.0, 26214400.0, 1073741824.0}) {
    for (const int p : {2, 3, 8, 12, 1024}) {
      for (const int node_size : {1, 4, 8, 64}) {
        for (const pt::AllreduceAlgo a : algos) {
          const double s = pt::modelled_time(a, bytes, p, node_size, t);
          if (!std::isfinite(s) || s < 0.0) {
            fuzz::finding("a modelled time is not a finite number of seconds",
                          std::string(pt::algorithm_name(a)) + " bytes " + std::to_string(bytes) +
                              " p " + std::to_string(p) + " node_size " +
                              std::to_string(node_size) + ": " + std::to_string(s) + "\n" +
                              pt::calibration_toml(t, ""));
          }
        }
        const pt::AllreduceAlgo c = pt::choose_algorithm(bytes, p, node_size, t);
        if (std::find(algos.begin(), algos.end(), c) == algos.end()) {
          fuzz::finding("choose_algorithm chose an algorithm it does not model",
                        pt::algorithm_name(c));
        }
      }
    }
  }
  return 0;
}
