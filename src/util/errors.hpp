// Error model of pipetrain (docs/design.md section 3).
// Collective errors: every rank reaches the same throw (same deck text, or after agree()), rank 0
// prints one message, every rank exits with the code. One-rank failures of a library call go
// through check_mpi()/fatal(), which print the rank's message and abort the job.
#pragma once

#include <mpi.h>

#include <optional>
#include <stdexcept>
#include <string>

namespace pt {

enum class ExitCode : int {
  ok = 0,
  other = 1,
  bad_input = 2,  // deck, command line, data file
  checkpoint = 3, // checkpoint unusable
  non_finite = 4, // loss or gradients not finite
  hang = 5,       // a rank waited past runtime.hang_timeout_s
};

class Error : public std::runtime_error {
public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

private:
  ExitCode code_;
};

// Convenience for the commonest collective error.
inline Error input_error(const std::string& message) {
  return Error(ExitCode::bad_input, message);
}

// Collective: every rank of `comm` calls it. If any rank passes an error, the one of the
// lowest such rank is thrown on every rank (so rank 0 can print it and all exit together).
void agree(MPI_Comm comm, const std::optional<Error>& local);

// Aborts the whole job with this rank's message (for failures that cannot be agreed on).
[[noreturn]] void fatal(const std::string& message);

// MPI_Abort(MPI_COMM_WORLD, code), and this rank's own exit with `code` if the launcher has not
// ended it within a grace period (a host the launcher cannot reach leaves MPI_Abort waiting on
// the launcher's own timeouts; docs/running.md).
[[noreturn]] void abort_job(ExitCode code);

// Checked MPI call: reports the call, file and line, then aborts.
void check_mpi(int err, const char* call, const char* file, int line);

} // namespace pt

#define PT_MPI(call) ::pt::check_mpi((call), #call, __FILE__, __LINE__)
