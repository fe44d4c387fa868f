#include "tools/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/rendezvous.h"

extern char** environ;

namespace dcp::tools {
namespace {

volatile sig_atomic_t g_signal = 0;

void OnSignal(int sig) { g_signal = sig; }

// Installs SIGINT/SIGTERM handlers for the launcher's lifetime.
class SignalForwarding {
 public:
  SignalForwarding() {
    g_signal = 0;
    struct sigaction action = {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~SignalForwarding() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
};

void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // Nowhere to report a broken output; drop it.
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// One output stream of one rank: the pipe and the unfinished line.
struct Stream {
  int fd = -1;
  int out_fd = -1;
  std::string pending;

  // Writes every complete line in `pending`, prefixed; with `flush`, also
  // the unfinished rest (a newline is added).
  void Emit(const std::string& prefix, bool flush) {
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      WriteAll(out_fd, absl::StrCat(prefix, absl::string_view(pending).substr(
                                                start, nl + 1 - start)));
    }
    pending.erase(0, start);
    if (flush && !pending.empty()) {
      WriteAll(out_fd, absl::StrCat(prefix, pending, "\n"));
      pending.clear();
    }
  }

  // Reads what is available; closes the pipe at EOF or error.
  void Drain(const std::string& prefix) {
    char buf[65536];
    while (fd >= 0) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n > 0) {
        pending.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      close(fd);
      fd = -1;
    }
    Emit(prefix, /*flush=*/fd < 0);
  }
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  Stream out;
  Stream err;
  std::string prefix;
};

// The environment of local rank `local` of node `options.node_rank`: the
// launcher's, with the rendezvous variables replaced.
std::vector<std::string> RankEnvironment(const LaunchOptions& options,
                                         int local,
                                         const std::string& rendezvous,
                                         const std::string& job_id) {
  const int rank = options.node_rank * options.num_ranks + local;
  const int size = options.num_nodes * options.num_ranks;
  std::vector<std::string> ours = {
      absl::StrCat("DCP_RANK=", rank),
      absl::StrCat("DCP_WORLD_SIZE=", size),
      absl::StrCat("RANK=", rank),
      absl::StrCat("WORLD_SIZE=", size),
      absl::StrCat("DCP_RENDEZVOUS=", rendezvous),
      absl::StrCat("LOCAL_RANK=", local),
      absl::StrCat("LOCAL_WORLD_SIZE=", options.num_ranks),
      absl::StrCat("GROUP_RANK=", options.node_rank),
  };
  if (!job_id.empty()) ours.push_back(absl::StrCat("DCP_JOB_ID=", job_id));
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view entry(*e);
    bool replaced = false;
    for (const std::string& var : ours) {
      if (absl::StartsWith(entry, var.substr(0, var.find('=') + 1))) {
        replaced = true;
      }
    }
    if (!replaced) env.emplace_back(entry);
  }
  env.insert(env.end(), ours.begin(), ours.end());
  return env;
}

// A job id no other job has: 64 random bits and this process's id.
std::string RandomJobId() {
  std::random_device random;
  const uint64_t bits = (uint64_t{random()} << 32) | random();
  return absl::StrFormat("%016x-%d", bits, getpid());
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void SignalRank(const Rank& rank, int sig) {
  if (!rank.running) return;
  // Each rank leads its own process group, so its children stop too.
  if (kill(-rank.pid, sig) != 0) kill(rank.pid, sig);
}

}  // namespace

void AddLaunchOptions(CLI::App& app, LaunchOptions* options) {
  app.add_option("-n,--nproc,--nproc-per-node", options->num_ranks,
                 "number of ranks on this node")
      ->required()
      ->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", options->num_nodes, "number of nodes (default 1)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--node-rank", options->node_rank,
                 "this node's index in [0, nnodes) (default 0)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--rendezvous", options->rendezvous,
                 "where the ranks meet: a directory every node shares or "
                 "redis://HOST:PORT (default on one node: a temporary "
                 "directory, removed afterwards)");
  app.add_option("--job-id", options->job_id,
                 "the job's id, the same on every node (default: from the "
                 "environment, or random on one node)");
  app.add_option_function<double>(
      "--grace-seconds",
      [options](double seconds) { options->grace = absl::Seconds(seconds); },
      "seconds between SIGTERM and SIGKILL when stopping ranks (default 5)");
  app.add_option("command", options->command, "-- PROGRAM ARGS...")->required();
}

absl::StatusOr<LaunchOptions> ParseLaunchArgs(int argc,
                                              const char* const* argv) {
  LaunchOptions options;
  CLI::App app(kLaunchDescription, "dcp_launch");
  AddLaunchOptions(app, &options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return absl::CancelledError("help printed");
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("dcp_launch: ", e.what(), "\n", app.help()));
  }
  return options;
}

absl::StatusOr<int> Launch(const LaunchOptions& options) {
  if (options.num_ranks < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dcp_launch: -n %d: need at least one rank", options.num_ranks));
  }
  if (options.command.empty()) {
    return absl::InvalidArgumentError(
        "dcp_launch: no program given (dcp_launch -n N -- PROGRAM ARGS)");
  }

  if (options.node_rank < 0 || options.node_rank >= options.num_nodes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dcp_launch: --node-rank %d is outside [0, --nnodes %d)",
        options.node_rank, options.num_nodes));
  }
  if (options.num_nodes > 1 && options.rendezvous.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "dcp_launch: --nnodes %d needs --rendezvous: a directory every node "
        "shares or redis://HOST:PORT",
        options.num_nodes));
  }
  std::string job_id = options.job_id;
  if (job_id.empty()) job_id = comm::JobIdFromEnvironment();
  if (job_id.empty() && options.num_nodes == 1) job_id = RandomJobId();

  // The rendezvous.
  std::string rendezvous = options.rendezvous;
  bool remove_rendezvous = false;
  absl::StatusOr<comm::StoreAddress> address =
      comm::ParseStoreAddress(rendezvous);
  if (!rendezvous.empty() && !address.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dcp_launch: --rendezvous: ", address.status().message()));
  }
  if (rendezvous.empty()) {
    const char* tmp = getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp",
                                       "/dcp-rendezvous-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(
          absl::StrCat("dcp_launch: mkdtemp ", pattern, ": ", strerror(errno)));
    }
    rendezvous = pattern;
    remove_rendezvous = true;
  } else if (address->kind == comm::StoreAddress::Kind::kFile) {
    std::error_code ec;
    std::filesystem::create_directories(rendezvous, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dcp_launch: rendezvous directory ", rendezvous, ": ", ec.message()));
    }
  }

  SignalForwarding forwarding;
  std::vector<Rank> ranks(options.num_ranks);
  absl::Status start_error;
  for (int r = 0; r < options.num_ranks && start_error.ok(); ++r) {
    Rank& rank = ranks[r];
    rank.prefix =
        absl::StrCat("[rank ", options.node_rank * options.num_ranks + r, "] ");
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0) {
      start_error =
          absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
      break;
    }
    if (pipe2(err_pipe, O_CLOEXEC) != 0) {
      close(out_pipe[0]);
      close(out_pipe[1]);
      start_error =
          absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
      break;
    }
    std::vector<std::string> env =
        RankEnvironment(options, r, rendezvous, job_id);
    std::vector<std::string> args = options.command;
    std::vector<char*> envp = CStrings(env);
    std::vector<char*> argp = CStrings(args);
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      start_error =
          absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
        close(fd);
      break;
    }
    if (pid == 0) {
      setpgid(0, 0);
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      sigaction(SIGINT, &dfl, nullptr);
      sigaction(SIGTERM, &dfl, nullptr);
      dup2(out_pipe[1], STDOUT_FILENO);
      dup2(err_pipe[1], STDERR_FILENO);
      execvpe(argp[0], argp.data(), envp.data());
      const std::string msg = absl::StrCat("dcp_launch: cannot run ", args[0],
                                           ": ", strerror(errno), "\n");
      WriteAll(STDERR_FILENO, msg);
      _exit(127);
    }
    setpgid(pid, pid);
    close(out_pipe[1]);
    close(err_pipe[1]);
    fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
    fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
    rank.pid = pid;
    rank.running = true;
    rank.out = {out_pipe[0], options.stdout_fd, ""};
    rank.err = {err_pipe[0], options.stderr_fd, ""};
  }

  std::optional<int> first_failure;
  if (!start_error.ok()) first_failure = 1;
  std::optional<absl::Time> stop_started;
  bool killed = false;
  auto stop_all = [&](int sig) {
    for (const Rank& rank : ranks) SignalRank(rank, sig);
  };
  if (!start_error.ok()) {
    stop_started = absl::Now();
    stop_all(SIGTERM);
  }

  std::optional<absl::Time> all_exited_at;
  for (;;) {
    // Output.
    std::vector<pollfd> fds;
    for (Rank& rank : ranks) {
      for (Stream* s : {&rank.out, &rank.err}) {
        if (s->fd >= 0) fds.push_back({s->fd, POLLIN, 0});
      }
    }
    if (!fds.empty()) poll(fds.data(), fds.size(), 50);
    for (Rank& rank : ranks) {
      rank.out.Drain(rank.prefix);
      rank.err.Drain(rank.prefix);
    }
    // Exits.
    bool any_running = false;
    for (size_t r = 0; r < ranks.size(); ++r) {
      Rank& rank = ranks[r];
      if (!rank.running) continue;
      int status = 0;
      const pid_t got = waitpid(rank.pid, &status, WNOHANG);
      if (got == 0) {
        any_running = true;
        continue;
      }
      rank.running = false;
      const int code = got < 0             ? 1
                       : WIFEXITED(status) ? WEXITSTATUS(status)
                                           : 128 + WTERMSIG(status);
      if (code != 0 && !first_failure.has_value()) {
        first_failure = code;
        WriteAll(options.stderr_fd,
                 absl::StrFormat("[dcp_launch] rank %d exited with code %d; "
                                 "stopping the other ranks\n",
                                 options.node_rank * options.num_ranks +
                                     static_cast<int>(r),
                                 code));
        stop_started = absl::Now();
        stop_all(SIGTERM);
      }
    }
    if (g_signal != 0 && !stop_started.has_value()) {
      if (!first_failure.has_value()) first_failure = 128 + g_signal;
      stop_started = absl::Now();
      stop_all(SIGTERM);
    }
    if (stop_started.has_value() && !killed &&
        absl::Now() - *stop_started > options.grace) {
      stop_all(SIGKILL);
      killed = true;
    }
    if (!any_running) {
      if (!all_exited_at.has_value()) all_exited_at = absl::Now();
      bool open = false;
      for (const Rank& rank : ranks)
        open |= rank.out.fd >= 0 || rank.err.fd >= 0;
      // Leftover children of a rank may hold its pipes; stop waiting soon.
      if (!open || absl::Now() - *all_exited_at > absl::Seconds(1)) break;
    }
  }
  for (Rank& rank : ranks) {
    for (Stream* s : {&rank.out, &rank.err}) {
      if (s->fd >= 0) close(s->fd);
      s->fd = -1;
      s->Emit(rank.prefix, /*flush=*/true);
    }
  }
  if (remove_rendezvous) {
    std::error_code ec;
    std::filesystem::remove_all(rendezvous, ec);
  }
  if (!start_error.ok()) return start_error;
  return first_failure.value_or(0);
}

int LaunchMain(int argc, const char* const* argv) {
  absl::StatusOr<LaunchOptions> options = ParseLaunchArgs(argc, argv);
  if (!options.ok()) {
    if (absl::IsCancelled(options.status())) return 0;
    std::fprintf(stderr, "%s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<int> code = Launch(*options);
  if (!code.ok()) {
    std::fprintf(stderr, "%s\n", std::string(code.status().message()).c_str());
    return 1;
  }
  return *code;
}

}  // namespace dcp::tools
