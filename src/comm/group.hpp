// A group's size and this rank's place in it, the thread level MPI gave, and a duplicate of a
// communicator: what code outside comm/ asks of one (it makes no MPI call of its own).
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

// A duplicate of comm (collective over it), for a thread of its own; free_comm frees one unless
// MPI has finalized.
inline MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  PT_MPI(MPI_Comm_dup(comm, &dup));
  return dup;
}

inline void free_comm(MPI_Comm& comm) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
}

} // namespace pt
