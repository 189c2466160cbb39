#include "config/load_deck.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "comm/group.hpp"
#include "comm/watchdog.hpp"
#include "util/errors.hpp"

namespace pt {

RunConfig load_deck(MPI_Comm comm, const std::string& path,
                    const std::vector<std::string>& overrides) {
  const int rank = rank_in(comm);
  const int size = size_of(comm);

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

  // no timeout is known before the deck is read: plain blocking MPI
  Watchdog::none().broadcast_text(text, 0, comm, "the deck's text");
  // Every rank parses the same text, so every rank throws the same error, if any.
  return parse_deck(text, path, overrides, size);
}

} // namespace pt
