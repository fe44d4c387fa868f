// coord_bench: the standalone coordination benchmark (see coord_bench.h).
//
//   bazel run //bench/coord:coord_bench -- --ranks 2,4,8,16 --json
#include <cstdio>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "bench/coord/coord_bench.h"

int main(int argc, char** argv) {
  CLI::App app{
      "dcp coordination benchmark: plan exchange + commit per save over "
      "N local Gloo ranks"};
  dcp::CoordBenchFlags flags;
  app.add_option("--ranks,-n", flags.ranks, "rank counts, e.g. 2,4,8,16")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  app.add_option("--nodes", flags.nodes,
                 "node counts, e.g. 1,2,4 (N > 1: network namespaces, root)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--items", flags.items, "tensors per rank")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--item_bytes", flags.item_bytes, "bytes per tensor")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--saves", flags.saves, "saves per mode (median)")
      ->check(CLI::Range(2, 1000));
  app.add_option("--dir", flags.dir, "scratch root (default: $TMPDIR or /tmp)");
  app.add_flag("--json", flags.json, "print one JSON object");
  CLI11_PARSE(app, argc, argv);
  const absl::Status status = dcp::RunCoordBench(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "coord_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
