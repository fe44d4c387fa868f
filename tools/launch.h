// The local launcher: `dcp_launch -n N [--rendezvous DIR] -- PROGRAM ARGS`
// (to become `dcp launch`). Starts N ranks of PROGRAM on this machine with
// DCP_RANK, DCP_WORLD_SIZE, DCP_RENDEZVOUS and LOCAL_RANK set (what
// comm/rendezvous.h reads), prefixes every line a rank prints with
// "[rank K] " (stdout to stdout, stderr to stderr), stops every rank when
// one fails (SIGTERM, then SIGKILL after a grace period) and exits with the
// first failure's exit code (128 + signal for a rank killed by a signal).
// Without --rendezvous it makes a fresh temporary directory and removes it
// afterwards; a directory given with --rendezvous is kept and must be fresh
// for each job (Gloo's FileStore refuses keys left by an earlier job).
// SIGINT/SIGTERM sent to the launcher are passed on to the ranks.
#ifndef DCP_TOOLS_LAUNCH_H_
#define DCP_TOOLS_LAUNCH_H_

#include <string>
#include <vector>

#include "CLI/App.hpp"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dcp::tools {

struct LaunchOptions {
  int num_ranks = 1;
  // Shared directory for the rendezvous; empty: a fresh temporary one.
  std::string rendezvous;
  // PROGRAM and its arguments; PROGRAM is looked up on PATH.
  std::vector<std::string> command;
  // Between SIGTERM and SIGKILL when stopping the ranks.
  absl::Duration grace = absl::Seconds(5);
  // Where the prefixed lines go.
  int stdout_fd = 1;
  int stderr_fd = 2;
};

// One-line description of the launcher, for help texts.
inline constexpr char kLaunchDescription[] =
    "Starts N local ranks of PROGRAM with DCP_RANK, DCP_WORLD_SIZE, "
    "DCP_RENDEZVOUS and LOCAL_RANK set; prefixes their output with "
    "[rank K]; stops all when one fails and exits with its code.";

// Adds the launcher's options and the PROGRAM ARGS positional to `app`,
// filling `*options` when `app` parses (for `dcp launch` as a CLI11
// subcommand: add a subcommand, call this, then Launch(*options) when it
// was given). `options` must outlive parsing.
void AddLaunchOptions(CLI::App& app, LaunchOptions* options);

// Parses the launcher's command line (argv[0] is the program name).
// kInvalidArgument with CLI11's message and usage for bad input;
// kCancelled after printing help for --help.
absl::StatusOr<LaunchOptions> ParseLaunchArgs(int argc,
                                              const char* const* argv);

// Runs the ranks to completion. Returns the launcher's exit code: 0 when
// every rank exited 0, otherwise the first failure's code. kInvalidArgument
// for bad options; kInternal when pipes, fork or the temporary directory
// fail. Not thread-safe with itself (it installs SIGINT/SIGTERM handlers
// for its duration and reaps its own children).
absl::StatusOr<int> Launch(const LaunchOptions& options);

// ParseLaunchArgs + Launch, printing errors to stderr; returns the exit
// code for main().
int LaunchMain(int argc, const char* const* argv);

}  // namespace dcp::tools

#endif  // DCP_TOOLS_LAUNCH_H_
