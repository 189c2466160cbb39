// Reads the deck on rank 0, broadcasts its text, and parses it on every rank (collective).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "config/run_config.hpp"

namespace pt {

RunConfig load_deck(MPI_Comm comm, const std::string& path,
                    const std::vector<std::string>& overrides);

} // namespace pt
