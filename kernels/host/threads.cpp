// The host threads of a rank (kernels/ops.hpp, HostThreads): Kokkos' host execution space with
// n threads and every BLAS kept to one thread, the products' parallelism coming from the blocks
// of kernels/host/gemm.hpp.
#include <Kokkos_Core.hpp>

#include "ops.hpp"

#if defined(PT_BLAS_ONEDNN)
#include <omp.h>
#elif defined(PT_BLAS_OPENBLAS)
extern "C" void openblas_set_num_threads(int);
#elif defined(PT_BLAS_BLIS)
extern "C" void bli_thread_set_num_threads(long);
#endif

namespace pt::ops {

bool host_threads_available() {
#if defined(KOKKOS_ENABLE_OPENMP) || defined(KOKKOS_ENABLE_THREADS)
  return !std::is_same_v<Kokkos::DefaultHostExecutionSpace, Kokkos::Serial>;
#else
  return false;
#endif
}

const char* host_space_name() {
  return Kokkos::DefaultHostExecutionSpace::name();
}

HostThreads::HostThreads(int n) {
  // the OpenMP backend takes its pool size from here and prints its binding advice on every
  // rank unless warnings are off; the layout table shows the binding instead
  Kokkos::InitArguments args(host_threads_available() ? n : 1, -1, -1, true);
  Kokkos::initialize(args);
  // One BLAS thread: a product's blocks are the unit of parallelism, and a BLAS that threads a
  // block by itself (outside a parallel region) would sum it in an order set by the thread count
#if defined(PT_BLAS_ONEDNN)
  omp_set_num_threads(1); // oneDNN's threads are OpenMP's; Kokkos sets its own pool size
#elif defined(PT_BLAS_OPENBLAS)
  openblas_set_num_threads(1);
#elif defined(PT_BLAS_BLIS)
  bli_thread_set_num_threads(1);
#endif
}

HostThreads::~HostThreads() {
  Kokkos::finalize();
}

int host_threads() {
  return Kokkos::DefaultHostExecutionSpace::concurrency();
}

} // namespace pt::ops
