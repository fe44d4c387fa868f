// `dcp bench KIND [ARGS]`: runs one of the benchmark programs of bench/,
// which Bazel builds next to the dcp binary (bazel-bin/bench/...).
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "tools/commands.h"

namespace dcp {
namespace {

// Benchmark kind -> (Bazel target, path under bazel-bin).
const std::map<std::string, std::pair<std::string, std::string>>& Benches() {
  static const auto* benches =
      new std::map<std::string, std::pair<std::string, std::string>>{
          {"planner", {"//bench:planner_bench", "bench/planner_bench"}},
          {"io", {"//bench:io_bench", "bench/io_bench"}},
          {"layouts", {"//bench:layouts_bench", "bench/layouts_bench"}},
          {"staging", {"//bench:staging_bench", "bench/staging_bench"}},
          {"coord", {"//bench/coord:coord_bench", "bench/coord/coord_bench"}},
      };
  return *benches;
}

}  // namespace

std::vector<std::string> BenchKinds() {
  std::vector<std::string> kinds;
  for (const auto& [kind, target] : Benches()) kinds.push_back(kind);
  return kinds;
}

std::string BenchTarget(const std::string& kind) {
  auto it = Benches().find(kind);
  return it == Benches().end() ? "" : it->second.first;
}

absl::Status RunBench(const std::string& kind,
                      const std::vector<std::string>& args) {
  auto it = Benches().find(kind);
  if (it == Benches().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown benchmark \"", kind, "\"; choose one of ",
                     absl::StrJoin(BenchKinds(), ", ")));
  }
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n < 0) return ErrnoError(errno, "readlink /proc/self/exe");
  std::string root(self, n);
  // bazel-bin/tools/dcp -> bazel-bin/
  for (int i = 0; i < 2; ++i) root = root.substr(0, root.rfind('/'));
  const std::string program = absl::StrCat(root, "/", it->second.second);
  if (::access(program.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        program, " is not built; run `bazel build ", it->second.first,
        "` (./dcp.sh bench ", kind, " does that for you)"));
  }
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const std::string& arg : args) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  ::execv(program.c_str(), argv.data());
  return ErrnoError(errno, absl::StrCat("exec ", program));
}

}  // namespace dcp
