#include "config/load_deck.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "util/errors.hpp"

namespace pt {

RunConfig load_deck(MPI_Comm comm, const std::string& path,
                    const std::vector<std::string>& overrides) {
  int rank = 0;
  int size = 1;
  PT_MPI(MPI_Comm_rank(comm, &rank));
  PT_MPI(MPI_Comm_size(comm, &size));

  std::string text;
  std::optional<Error> err;
  if (rank == 0) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      err = input_error("cannot read deck '" + path + "': " + std::strerror(errno) +
                        "\n---> HINT: is the path right? decks live in inputs/, e.g. "
                        "inputs/tiny.toml");
    } else {
      std::ostringstream os;
      os << in.rdbuf();
      text = os.str();
    }
  }
  agree(comm, err);

  long long len = static_cast<long long>(text.size());
  PT_MPI(MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, comm));
  text.resize(static_cast<std::size_t>(len));
  PT_MPI(MPI_Bcast(text.data(), static_cast<int>(len), MPI_CHAR, 0, comm));
  // Every rank parses the same text, so every rank throws the same error, if any.
  return parse_deck(text, path, overrides, size);
}

} // namespace pt
