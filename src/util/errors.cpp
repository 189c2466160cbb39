#include "util/errors.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace pt {

void agree(MPI_Comm comm, const std::optional<Error>& local) {
  int rank = 0;
  int size = 1;
  PT_MPI(MPI_Comm_rank(comm, &rank));
  PT_MPI(MPI_Comm_size(comm, &size));
  const int mine = local ? rank : size;
  int first = size;
  PT_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == size) return;

  int header[2] = {0, 0}; // exit code, message length
  std::string text;
  if (rank == first) {
    text = local->what();
    header[0] = static_cast<int>(local->code());
    header[1] = static_cast<int>(text.size());
  }
  PT_MPI(MPI_Bcast(header, 2, MPI_INT, first, comm));
  text.resize(static_cast<std::size_t>(header[1]));
  PT_MPI(MPI_Bcast(text.data(), header[1], MPI_CHAR, first, comm));
  throw Error(static_cast<ExitCode>(header[0]), text);
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
