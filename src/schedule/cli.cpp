#include "schedule/cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "schedule/schedule.hpp"
#include "schedule/validate.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

constexpr ScheduleKind kNamed[] = {ScheduleKind::gpipe,       ScheduleKind::one_f_one_b,
                                   ScheduleKind::interleaved, ScheduleKind::zb_h1,
                                   ScheduleKind::zb_h2,       ScheduleKind::zb_v,
                                   ScheduleKind::v_half,      ScheduleKind::v_min,
                                   ScheduleKind::dualpipev,   ScheduleKind::two_bw};

// Per rank: F, BI and BW a third each of its stage's forward and backward (chunks of a rank share
// its cost); equal stages where none are given.
std::vector<schedule::Costs> rank_costs(const std::vector<double>& stage_costs, int p) {
  if (!stage_costs.empty() && static_cast<int>(stage_costs.size()) != p) {
    throw input_error("--stage-costs has " + std::to_string(stage_costs.size()) +
                      " entries: give one per pipeline rank (" + std::to_string(p) + ")");
  }
  std::vector<schedule::Costs> out;
  for (int r = 0; r < p; ++r) {
    out.push_back(schedule::split_stage_cost(
        stage_costs.empty() ? 3.0 : stage_costs[static_cast<std::size_t>(r)]));
  }
  return out;
}

schedule::Schedule build(const std::string& which, int p, int m, int v,
                         const std::vector<schedule::Costs>& costs, double memory) {
  if (which == "search") {
    try {
      if (v != 1) throw std::invalid_argument("it places one chunk per rank: virtual_stages 1");
      return schedule::search_schedule(p, m, costs, schedule::search_budget(memory, p));
    } catch (const std::invalid_argument& e) {
      throw input_error(std::string("schedule \"search\": ") + e.what());
    }
  }
  const std::string prefix = "file:";
  if (which.rfind(prefix, 0) == 0) {
    const std::string path = which.substr(prefix.size());
    std::ifstream in(path, std::ios::binary);
    if (!in) throw input_error("cannot read the schedule file '" + path + "'");
    std::ostringstream text;
    text << in.rdbuf();
    try {
      return schedule::from_csv(text.str(), p, m, v);
    } catch (const std::invalid_argument& e) {
      throw input_error("schedule file '" + path + "': " + e.what());
    }
  }
  std::string names;
  for (ScheduleKind k : kNamed) {
    if (which == name(k)) {
      try {
        return schedule::make_schedule(k, p, m, v);
      } catch (const std::invalid_argument& e) {
        throw input_error(std::string("schedule \"") + name(k) + "\": " + e.what());
      }
    }
    names += std::string(names.empty() ? "" : ", ") + name(k);
  }
  throw input_error("unknown schedule \"" + which + "\": one of " + names +
                    ", search, or file:PATH");
}

// Every rank's compute actions, one line a rank.
void print_lists(const schedule::Schedule& s) {
  std::istringstream rows(schedule::to_csv(s));
  std::string row;
  for (int r = 0; std::getline(rows, row); ++r) {
    for (char& c : row) c = c == ',' ? ' ' : c;
    std::printf("rank %d: %s\n", r, row.c_str());
  }
}

} // namespace

int schedule_main(int argc, char** argv) {
  CLI::App app{"pipetrain schedule: a pipeline schedule's compute actions per rank, its simulated "
               "bubble and peak live micro-batches (one process, no mpirun; docs/pipeline.md).\n"
               "Usage: pipetrain schedule NAME|search|file:PATH --pp P --micro-batches M "
               "[--virtual-stages V] [--stage-costs C,C,...] [--memory X] [--csv]"};
  std::string which;
  int p = 0, m = 0, v = 0;
  bool csv = false;
  double memory = 1.0;
  std::vector<double> stage_costs;
  app.add_option("schedule", which, "a built-in schedule's name, or file:PATH (a CSV schedule)")
      ->required();
  app.add_option("--pp", p, "pipeline ranks")->required()->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", m, "micro-batches per step")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--virtual-stages", v,
                 "chunks per rank (default: 2 for interleaved and the V schedules, else 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--stage-costs", stage_costs,
                 "forward + backward time of each rank's stage, comma-separated (F, I and W a "
                 "third each): the simulated figures and search use them (default: equal)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--memory", memory,
                 "search: activations a rank may hold, in multiples of pp micro-batches "
                 "(parallel.search_memory; default 1)")
      ->check(CLI::Range(0.1, 64.0));
  app.add_flag("--csv", csv,
               "print the CSV that parallel.schedule = \"file:PATH\" runs (PyTorch's "
               "compute-only form); the figures go to stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (v == 0) v = schedule::default_chunks(which);
    const std::vector<schedule::Costs> costs = rank_costs(stage_costs, p);
    const schedule::Schedule s = build(which, p, m, v, costs, memory);
    if (s.name == "2bw") {
      throw input_error("2bw spans optimizer steps (asynchronous): it has no CSV form");
    }
    const schedule::Validation check = schedule::validate(s);
    if (!check.ok) throw input_error("the schedule is invalid: " + check.error);
    const schedule::Simulation sim = schedule::simulate(s, costs);
    std::ostringstream figures;
    figures.setf(std::ios::fixed);
    figures.precision(1);
    figures << "# " << which << ": pp " << p << ", " << m << " micro-batches, virtual_stages " << v
            << " (" << (s.vshape ? "V" : "loop") << " placement); simulated step " << sim.step_time
            << ", bubble " << 100.0 * schedule::step_bubble(sim) << "% ("
            << (stage_costs.empty() ? "F 1, B 2, I 1, W 1" : "--stage-costs")
            << ", messages free); peak live micro-batches per rank:";
    for (int n : check.peak_live) figures << ' ' << n;
    figures << '\n';
    if (csv) {
      std::fputs(schedule::to_csv(s).c_str(), stdout);
      std::fputs(figures.str().c_str(), stderr);
    } else {
      std::fputs(figures.str().c_str(), stdout);
      print_lists(s);
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "pipetrain: error: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}

} // namespace pt
