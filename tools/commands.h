// The subcommands of the dcp command line, as functions so tests can call
// them. Each prints to stdout and returns a Status describing any failure.
#ifndef DCP_TOOLS_COMMANDS_H_
#define DCP_TOOLS_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dcp {

struct DemoFlags {
  std::string size = "1GiB";
  std::string dir;  // Empty: a temporary directory, removed afterwards.
  uint64_t seed = 1;
  std::string mode = "roundtrip";
  bool json = false;
  bool cold_load = true;
};

// Parses "1GiB", "256MiB", "4G", "1000000" (bytes).
absl::StatusOr<int64_t> ParseSize(const std::string& text);

absl::Status RunDemo(const DemoFlags& flags);
absl::Status RunInspect(const std::string& dir);
absl::Status RunVerify(const std::string& dir);
// `dcp verify --clean DIR`, before the verification: takes the directory's
// lock (kFailedPrecondition naming the holder while a save runs), removes
// the orphans of interrupted saves (RemoveOrphans, io/
// file_system_storage.h), prints each name removed and the bytes
// reclaimed. The cleanup's error when orphans remain or none were looked
// for (kDataLoss when the committed metadata cannot be read).
absl::Status RunClean(const std::string& dir);

// The benchmark kinds `dcp bench` knows ("coord", "io", ...) and the Bazel
// target that builds each ("" for an unknown kind).
std::vector<std::string> BenchKinds();
std::string BenchTarget(const std::string& kind);

// Replaces this process with the benchmark program of `kind` (built next to
// dcp under bazel-bin/bench/); returns only on failure.
absl::Status RunBench(const std::string& kind,
                      const std::vector<std::string>& args);

}  // namespace dcp

#endif  // DCP_TOOLS_COMMANDS_H_
