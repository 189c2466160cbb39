// A group's size and this rank's place in it, and the thread level MPI gave: the questions about
// a communicator that code outside comm/ asks (it makes no MPI call of its own).
#pragma once

#include <mpi.h>

#include "util/errors.hpp"

namespace pt {

inline int rank_in(MPI_Comm comm) {
  int rank = 0;
  PT_MPI(MPI_Comm_rank(comm, &rank));
  return rank;
}

inline int size_of(MPI_Comm comm) {
  int size = 1;
  PT_MPI(MPI_Comm_size(comm, &size));
  return size;
}

// The thread level MPI provides (comm.overlap = "thread" needs MPI_THREAD_MULTIPLE).
inline int thread_level() {
  int provided = MPI_THREAD_SINGLE;
  PT_MPI(MPI_Query_thread(&provided));
  return provided;
}

} // namespace pt
