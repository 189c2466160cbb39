// pipetrain-bench simulate: the topology model's time of each algorithm on N nodes, next to the
// bandwidth bound and auto's modelled choice.
#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "comm/topology.hpp"
#include "common.hpp"

namespace bench {

int simulate(const Args& a) {
  const int nodes = static_cast<int>(a.num("--nodes", 0));
  if (nodes < 1) throw std::invalid_argument("simulate needs --nodes N (N >= 1)");
  const int g = std::max(1, static_cast<int>(a.num("--ranks-per-node", 1)));
  const int p = nodes * g;
  const pt::Topology topo = topology_from(a, nodes);
  const double min_bytes = std::max(4.0, a.num("--min-bytes", 8));
  const double max_bytes = a.num("--max-bytes", 256.0 * 1048576);
  std::printf("# modelled all-reduce time (us), %d nodes x %d ranks = %d ranks, topology %s\n"
              "# inter-node: alpha %.2f us, %.2f GB/s; intra-node: alpha %.2f us, %.2f GB/s, "
              "window copy %.2f GB/s; gamma %.3f ns/B\n",
              nodes, g, p, topo.name.c_str(), topo.inter.alpha * 1e6, 1e-9 / topo.inter.beta,
              topo.intra.alpha * 1e6, 1e-9 / topo.intra.beta, 1e-9 / topo.intra.copy,
              topo.intra.gamma * 1e9);
  std::printf("%10s", "bytes");
  for (pt::AllreduceAlgo al : pt::modelled_algorithms()) {
    std::printf(" %12.12s", pt::algorithm_name(al));
  }
  std::printf(" %12s  %s\n", "bw-bound", "fastest");
  for (double bytes = min_bytes; bytes <= max_bytes * 1.0000001; bytes *= 4) {
    std::printf("%10s", human(bytes).c_str());
    for (pt::AllreduceAlgo al : pt::modelled_algorithms()) {
      std::printf(" %12.1f", pt::modelled_time(al, bytes, p, g, topo) * 1e6);
    }
    std::printf(" %12.1f  %s\n", pt::bandwidth_bound(bytes, p, g, topo) * 1e6,
                pt::algorithm_name(pt::choose_algorithm(bytes, p, g, topo)));
  }
  return 0;
}

} // namespace bench
