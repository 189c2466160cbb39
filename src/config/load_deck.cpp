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
  RunConfig cfg = parse_deck(text, path, overrides, size);
  if (cfg.parallel.schedule == ScheduleKind::file) {
    // the schedule file, like the deck, is read once and broadcast
    const std::string& file = cfg.parallel.schedule_file;
    if (rank == 0) {
      std::ifstream in(file, std::ios::binary);
      std::ostringstream os;
      if (in) os << in.rdbuf();
      if (!in) {
        err = input_error(path + ": parallel.schedule = \"file:" + file + "\": cannot read '" +
                          file + "': " + std::strerror(errno) +
                          "\n---> HINT: `pipetrain schedule NAME --pp P --micro-batches M "
                          "--csv > FILE` writes a schedule to start from");
      }
      cfg.parallel.schedule_csv = os.str();
    }
    agree(comm, err);
    Watchdog::none().broadcast_text(cfg.parallel.schedule_csv, 0, comm, "the schedule file");
  }
  return cfg;
}

} // namespace pt
