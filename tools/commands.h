// The subcommands of the dcp command line, as functions so tests can call
// them. Each prints to stdout and returns a Status describing any failure.
#ifndef DCP_TOOLS_COMMANDS_H_
#define DCP_TOOLS_COMMANDS_H_

#include <cstdint>
#include <string>

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

}  // namespace dcp

#endif  // DCP_TOOLS_COMMANDS_H_
