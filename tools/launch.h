// The launcher: `dcp launch -n P [--nnodes N --node-rank R] [--rendezvous
// DIR|redis://HOST:PORT] [--job-id ID] -- PROGRAM ARGS` (also built as
// dcp_launch). Starts P ranks of PROGRAM on this machine, node R of N,
// with global ranks R*P .. R*P+P-1 of a world of N*P. Each rank gets
// DCP_RANK/RANK, DCP_WORLD_SIZE/WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK (the node), DCP_RENDEZVOUS and DCP_JOB_ID (what
// comm/rendezvous.h reads), and, where the launcher's environment does not
// set them, what torchrun also gives its workers: on one node MASTER_ADDR
// (127.0.0.1) and a free MASTER_PORT, so torch.distributed's env://
// initialization works as under torchrun; with several local ranks
// OMP_NUM_THREADS=1. Ranks read stdin from /dev/null (a rank reading the
// terminal would be stopped for good). Every line a rank prints (ended by a
// newline, or a carriage return: progress redrawn in place) is prefixed with
// "[rank K] " (K global; stdout to stdout, stderr to stderr). When one
// local rank fails, every local rank is stopped (SIGTERM, then SIGKILL
// after a grace period) and the launcher exits with the first failure's
// exit code (128 + signal for a rank killed by a signal); ranks on other
// nodes then fail at their next collective, naming the lost ranks, and
// their launchers exit non-zero the same way. SIGINT, SIGTERM, SIGHUP and
// SIGQUIT sent to the launcher stop its ranks the same way (exit code 128 +
// the signal); SIGHUP and SIGQUIT only when not ignored when it started
// (under nohup they stay ignored, in the ranks too).
//
// Each rank leads a process group of its own, and stopping signals the
// whole group, also of ranks that have exited already: children a rank
// left behind (data-loader workers, the child of a wrapper script) stop
// with the job, and the launcher waits for them (SIGKILL after the grace
// period) before it returns. After a successful job (every rank exited 0)
// what is left in the ranks' process groups gets `stray_wait`
// (--stray-wait-seconds, default 1) to exit on its own (a resource
// tracker or worker that exits when its rank's pipe closes), then is
// stopped the same way, and the launcher says on stderr how many processes
// of which rank's group; the exit code stays 0 unless a signal reaches the
// launcher meanwhile (128 + the signal). (torchrun signals only the groups
// of ranks still running.) A child that left its rank's group (setsid, a
// daemon) is out of reach. A launcher killed outright (SIGKILL)
// cannot stop anything itself: its ranks get SIGTERM from the kernel when it
// dies (PR_SET_PDEATHSIG; their own children do not). Supervision blocks until
// a rank writes or exits or a signal or deadline comes; it uses no CPU while
// the ranks run.
//
// Rendezvous: --rendezvous, else DCP_RENDEZVOUS from the environment; on one
// node without either, a fresh temporary directory,
// removed afterwards. Across nodes --rendezvous is required: a directory
// every node shares, or a redis server every node reaches. Either may be
// reused by later jobs (see comm/gloo_process_group.h).
// Job id: --job-id, else the one the environment names (DCP_JOB_ID, SLURM,
// torchrun, Open MPI; see comm/rendezvous.h), else on one node a random
// one. Across nodes without either, DCP_JOB_ID is left unset: consecutive
// jobs still work, but jobs sharing the rendezvous at the same time need
// distinct ids, so pass the same --job-id to every node's launcher.
#ifndef DCP_TOOLS_LAUNCH_H_
#define DCP_TOOLS_LAUNCH_H_

#include <string>
#include <vector>

#include "CLI/App.hpp"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dcp::tools {

struct LaunchOptions {
  // Ranks on this node (--nproc-per-node).
  int num_ranks = 1;
  // Nodes in the job, and which one this is.
  int num_nodes = 1;
  int node_rank = 0;
  // A shared directory or redis://host:port; empty: a fresh temporary
  // directory (one node only).
  std::string rendezvous;
  // The job's id; empty: from the environment, or random (see above).
  std::string job_id;
  // PROGRAM and its arguments; PROGRAM is looked up on PATH.
  std::vector<std::string> command;
  // Between SIGTERM and SIGKILL when stopping the ranks.
  absl::Duration grace = absl::Seconds(5);
  // After every rank exited 0: how long what is left in their process
  // groups may take to exit on its own before it is stopped.
  absl::Duration stray_wait = absl::Seconds(1);
  // Where the prefixed lines go.
  int stdout_fd = 1;
  int stderr_fd = 2;
};

// One-line description of the launcher, for help texts.
inline constexpr char kLaunchDescription[] =
    "Starts P ranks of PROGRAM on this node (node R of N) with DCP_RANK, "
    "DCP_WORLD_SIZE, DCP_RENDEZVOUS, DCP_JOB_ID and LOCAL_RANK set; "
    "prefixes their output with [rank K]; stops all when one fails and "
    "exits with its code.";

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
// for bad options (node rank outside [0, nodes), several nodes without
// --rendezvous, a bad rendezvous address); kInternal when pipes, fork or the
// temporary directory fail. Not thread-safe with itself (it installs
// SIGINT/SIGTERM/SIGHUP/SIGQUIT handlers for its duration and reaps its own
// children). The ranks get SIGTERM when the calling thread exits, so call
// it from a thread that outlives the job (Launch returns only after it).
absl::StatusOr<int> Launch(const LaunchOptions& options);

// ParseLaunchArgs + Launch, printing errors to stderr; returns the exit
// code for main().
int LaunchMain(int argc, const char* const* argv);

}  // namespace dcp::tools

#endif  // DCP_TOOLS_LAUNCH_H_
