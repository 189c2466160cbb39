// The error model's MPI side (util/errors.hpp): agreeing on an error, aborting the job, checked
// MPI calls.
#include "util/errors.hpp"

#include "comm/watchdog.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace pt {

void agree(MPI_Comm comm, const std::optional<Error>& local) {
  Watchdog::none().agree(comm, local, "the agreement on an error");
}

void fatal(const std::string& message) {
  int rank = -1;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "pipetrain: fatal on rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  if (initialized) abort_job(ExitCode::other);
  std::exit(static_cast<int>(ExitCode::other));
}

void abort_job(ExitCode code) {
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(static_cast<int>(code));
  }).detach();
  // the launcher forwards what this rank wrote through a pipe; MPI_Abort kills its forwarders, so
  // give them a moment to pass the message on (MPICH's once lost it: exit 5 without the message)
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Abort(MPI_COMM_WORLD, static_cast<int>(code));
  std::_Exit(static_cast<int>(code));
}

void check_mpi(int err, const char* call, const char* file, int line) {
  if (err == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(err, text, &len);
  fatal(std::string("MPI error in ") + call + " at " + file + ":" + std::to_string(line) + ": " +
        text +
        "\n---> HINT: check the launcher (mpirun/srun) and that all ranks run the same"
        " binary");
}

} // namespace pt
