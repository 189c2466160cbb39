// Test guard for the GPU backend's rule "MPI and MPI-IO see host memory only" (docs/cuda.md),
// checked on a machine without a GPU. Loaded into pipetrain with LD_PRELOAD, next to
// PIPETRAIN_TEST_STAGED=1: the host-staged backend reports each block it allocates (its
// "device" memory) to pt_mpi_guard_device_block, and every MPI call that takes a buffer, and
// HDF5's H5Dwrite/H5Dread, fail the run (exit 86) when handed an address inside such a block.
// The MPI wrappers use the profiling interface (PMPI_*); HDF5's are found with dlsym(RTLD_NEXT).
// At MPI_Finalize each rank prints how many buffers it checked, so a test can tell that the
// guard was loaded.
#include <dlfcn.h>
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace {

std::mutex mu; // comm.overlap = "thread" calls MPI from a second thread
std::map<std::uintptr_t, std::size_t> blocks; // start -> bytes
unsigned long long checked = 0;
bool seen_block = false;

void check(const void* buf, const char* call) {
  if (buf == nullptr || buf == MPI_IN_PLACE || buf == MPI_BOTTOM) return;
  const auto a = reinterpret_cast<std::uintptr_t>(buf);
  std::lock_guard<std::mutex> lock(mu);
  ++checked;
  auto it = blocks.upper_bound(a);
  if (it == blocks.begin()) return;
  --it;
  if (a < it->first + it->second) {
    std::fprintf(stderr,
                 "mpi guard: %s was handed device memory (address %p, %zu bytes into a block of "
                 "%zu): a GPU backend's memory must be staged through host buffers\n",
                 call, buf, static_cast<std::size_t>(a - it->first), it->second);
    std::fflush(stderr);
    std::_Exit(86);
  }
}

template <class Fn> Fn next(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "mpi guard: %s not found\n", name);
    std::_Exit(86);
  }
  return reinterpret_cast<Fn>(f);
}

} // namespace

extern "C" {

void pt_mpi_guard_device_block(const void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu);
  seen_block = true;
  if (bytes == 0) {
    blocks.erase(reinterpret_cast<std::uintptr_t>(p));
  } else {
    blocks[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  }
}

int MPI_Send(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c) {
  check(buf, "MPI_Send");
  return PMPI_Send(buf, n, t, dest, tag, c);
}

int MPI_Recv(void* buf, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status* s) {
  check(buf, "MPI_Recv");
  return PMPI_Recv(buf, n, t, src, tag, c, s);
}

int MPI_Isend(const void* buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c,
              MPI_Request* r) {
  check(buf, "MPI_Isend");
  return PMPI_Isend(buf, n, t, dest, tag, c, r);
}

int MPI_Irecv(void* buf, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Request* r) {
  check(buf, "MPI_Irecv");
  return PMPI_Irecv(buf, n, t, src, tag, c, r);
}

int MPI_Sendrecv(const void* sb, int sn, MPI_Datatype st, int dest, int stag, void* rb, int rn,
                 MPI_Datatype rt, int src, int rtag, MPI_Comm c, MPI_Status* s) {
  check(sb, "MPI_Sendrecv");
  check(rb, "MPI_Sendrecv");
  return PMPI_Sendrecv(sb, sn, st, dest, stag, rb, rn, rt, src, rtag, c, s);
}

int MPI_Allreduce(const void* sb, void* rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  check(sb, "MPI_Allreduce");
  check(rb, "MPI_Allreduce");
  return PMPI_Allreduce(sb, rb, n, t, op, c);
}

int MPI_Iallreduce(const void* sb, void* rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                   MPI_Request* r) {
  check(sb, "MPI_Iallreduce");
  check(rb, "MPI_Iallreduce");
  return PMPI_Iallreduce(sb, rb, n, t, op, c, r);
}

int MPI_Bcast(void* buf, int n, MPI_Datatype t, int root, MPI_Comm c) {
  check(buf, "MPI_Bcast");
  return PMPI_Bcast(buf, n, t, root, c);
}

int MPI_Ibcast(void* buf, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request* r) {
  check(buf, "MPI_Ibcast");
  return PMPI_Ibcast(buf, n, t, root, c, r);
}

int MPI_Allgather(const void* sb, int sn, MPI_Datatype st, void* rb, int rn, MPI_Datatype rt,
                  MPI_Comm c) {
  check(sb, "MPI_Allgather");
  check(rb, "MPI_Allgather");
  return PMPI_Allgather(sb, sn, st, rb, rn, rt, c);
}

int MPI_Gather(const void* sb, int sn, MPI_Datatype st, void* rb, int rn, MPI_Datatype rt, int root,
               MPI_Comm c) {
  check(sb, "MPI_Gather");
  check(rb, "MPI_Gather");
  return PMPI_Gather(sb, sn, st, rb, rn, rt, root, c);
}

herr_t H5Dwrite(hid_t d, hid_t mt, hid_t ms, hid_t fs, hid_t dxpl, const void* buf) {
  static const auto real =
      next<herr_t (*)(hid_t, hid_t, hid_t, hid_t, hid_t, const void*)>("H5Dwrite");
  check(buf, "H5Dwrite");
  return real(d, mt, ms, fs, dxpl, buf);
}

herr_t H5Dread(hid_t d, hid_t mt, hid_t ms, hid_t fs, hid_t dxpl, void* buf) {
  static const auto real = next<herr_t (*)(hid_t, hid_t, hid_t, hid_t, hid_t, void*)>("H5Dread");
  check(buf, "H5Dread");
  return real(d, mt, ms, fs, dxpl, buf);
}

int MPI_Finalize() {
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  {
    std::lock_guard<std::mutex> lock(mu);
    std::printf("mpi guard (rank %d): %llu buffers checked, none in device memory%s\n", rank,
                checked, seen_block ? "" : " (no device blocks were reported)");
    std::fflush(stdout);
  }
  return PMPI_Finalize();
}

} // extern "C"
