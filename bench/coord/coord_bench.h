// The coordination benchmark as a function, so the dcp command line
// (`dcp bench coord`) and the standalone coord_bench binary share it. See
// coord_bench.cc for what is measured and how data writes are excluded.
#ifndef DCP_BENCH_COORD_COORD_BENCH_H_
#define DCP_BENCH_COORD_COORD_BENCH_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace dcp {

struct CoordBenchFlags {
  // Rank counts to measure, each in its own set of forked processes.
  std::vector<int> ranks = {2, 4, 8, 16};
  // "Node" counts to spread the ranks over: 1 runs every rank on
  // 127.0.0.1; N > 1 makes N network namespaces joined by a bridge
  // (bench/coord/netns.h; needs root) and puts contiguous blocks of ranks
  // in each, listening on its node's address. Rank counts below N are
  // skipped for it.
  std::vector<int> nodes = {1};
  // The tiny per-rank state: `items` tensors of `item_bytes` each.
  int items = 64;
  int item_bytes = 1024;
  // Saves per mode (plan caching off, then on); the report is the median.
  int saves = 5;
  // Scratch root for rendezvous and checkpoints (empty: $TMPDIR or /tmp);
  // what the benchmark writes there is removed.
  std::string dir;
  // Print one JSON object instead of a table.
  bool json = false;
  // Collective timeout of each rank's group.
  absl::Duration timeout = absl::Seconds(60);
};

// Forks the ranks, measures (rendezvous: first rank starting to join to
// last rank joined; then each save's coordination), prints the table or
// JSON to stdout. Must be
// called from a single-threaded process (it forks). kInvalidArgument for a
// rank count below 1; kInternal when a rank fails or hangs (the rank's own
// error is on stderr); kDataLoss when a rank's report is incomplete;
// kFailedPrecondition when namespaces cannot be made.
absl::Status RunCoordBench(const CoordBenchFlags& flags);

}  // namespace dcp

#endif  // DCP_BENCH_COORD_COORD_BENCH_H_
