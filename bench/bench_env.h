// What the benchmark programs of bench/ take from their environment: child
// processes (their stdout, exit code, peak RSS and CPU time), the files
// shipped next to the program (Bazel runfiles), the source commit it was
// built from, the time and the load average for the log, and medians.
//
// Thread safety: every function may be called from any thread; RunProcess
// forks, so call it where no other thread holds a lock the child needs (the
// child only calls dup2 and exec).
#ifndef DCP_BENCH_BENCH_ENV_H_
#define DCP_BENCH_BENCH_ENV_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/machine_info.h"

namespace dcp {

struct ProcessRun {
  int exit_code = 0;    // 128 + the signal for a child killed by one.
  std::string out;      // Its stdout (its stderr passes through).
  int64_t max_rss = 0;  // Bytes: ru_maxrss of the child (wait4).
  double user_seconds = 0;
  double system_seconds = 0;
};

// Runs argv[0] (searched on PATH) with stdout captured and waits for it.
// Errors only when the process cannot be started or waited for (a failed
// exec is exit code 127).
absl::StatusOr<ProcessRun> RunProcess(const std::vector<std::string>& argv);

// Runs a program that prints one JSON object (all of its stdout, or its last
// line). kInternal when it exits non-zero (its stderr is above) or prints no
// JSON. `run`, when given, receives the process's exit, RSS and CPU time.
absl::StatusOr<nlohmann::json> RunJsonProcess(
    const std::vector<std::string>& argv, ProcessRun* run = nullptr);

// The path of `name` (e.g. "torch_env.sh") shipped next to this program
// under bench/ in its Bazel runfiles, else ./bench/name.
std::string BenchFile(const std::string& name);

// Creates `parent` (with its parents) and a fresh directory in it named
// `prefix` plus six random characters; returns the new directory's path.
absl::StatusOr<std::string> MakeWorkDir(const std::string& parent,
                                        const std::string& prefix);

// {"commit": short hash, "tree_modified": bool} of the source tree the
// program's runfiles point into; empty when git cannot tell.
nlohmann::json SourceCommit();

// This process's peak RSS so far in bytes (ru_maxrss).
int64_t PeakRssSelf();

// Every field of `machine`, for a report.
nlohmann::json MachineJson(const MachineInfo& machine);

// "2026-12-04 14:26:00 UTC".
std::string NowUtc();

// The 1, 5 and 15 minute load averages, "0.80 1.20 1.50".
std::string LoadAverage();

// The median (the mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> values);

}  // namespace dcp

#endif  // DCP_BENCH_BENCH_ENV_H_
