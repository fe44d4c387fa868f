#include "tools/launch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
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
// The write end of SignalForwarding's wake-up pipe (-1 without one).
volatile sig_atomic_t g_wake_fd = -1;

void OnSignal(int sig) {
  g_signal = sig;
  const int saved_errno = errno;
  const int fd = g_wake_fd;
  if (fd >= 0) {
    const char byte = 0;
    (void)!write(fd, &byte, 1);  // Full pipe: a wake-up is pending anyway.
  }
  errno = saved_errno;
}

// The signals the launcher passes on to its ranks.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Installs the handlers of kForwardedSignals for the launcher's lifetime,
// and a pipe the handler writes a byte to, so that the supervision loop's
// poll wakes on a signal however it races with it. SIGINT and SIGTERM are
// always caught; SIGHUP and SIGQUIT only when not ignored on entry (nohup,
// a background job), so that they stay ignored, in the ranks too.
class SignalForwarding {
 public:
  SignalForwarding() {
    g_signal = 0;
    int wake[2];
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) == 0) {
      wake_read_ = wake[0];
      wake_write_ = wake[1];
      g_wake_fd = wake_write_;
    }
    struct sigaction action = {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    sigemptyset(&signals_);
    for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
      const int sig = kForwardedSignals[i];
      sigaddset(&signals_, sig);
      sigaction(sig, nullptr, &old_[i]);
      if ((sig == SIGHUP || sig == SIGQUIT) && old_[i].sa_handler == SIG_IGN) {
        continue;
      }
      sigaction(sig, &action, nullptr);
      installed_[i] = true;
    }
  }
  ~SignalForwarding() {
    for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
      if (installed_[i]) sigaction(kForwardedSignals[i], &old_[i], nullptr);
    }
    g_wake_fd = -1;
    if (wake_read_ >= 0) close(wake_read_);
    if (wake_write_ >= 0) close(wake_write_);
  }

  // In a forked child before exec: the default action for every signal
  // this object caught (an ignored one stays ignored).
  void ResetInChild() const {
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
      if (installed_[i]) sigaction(kForwardedSignals[i], &dfl, nullptr);
    }
  }

  // kForwardedSignals, as a set.
  const sigset_t& signals() const { return signals_; }

  // Readable once a signal arrived since the last Drain; -1 without a pipe.
  int wake_fd() const { return wake_read_; }
  void Drain() const {
    char buf[64];
    while (wake_read_ >= 0 && read(wake_read_, buf, sizeof(buf)) > 0) {
    }
  }

 private:
  struct sigaction old_[std::size(kForwardedSignals)] = {};
  bool installed_[std::size(kForwardedSignals)] = {};
  sigset_t signals_;
  int wake_read_ = -1;
  int wake_write_ = -1;
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

  // Writes every complete line in `pending` (ended by a newline, or by a
  // carriage return: a progress line redrawn in place), prefixed; with
  // `flush`, also the unfinished rest (a newline is added).
  void Emit(const std::string& prefix, bool flush) {
    size_t start = 0;
    for (size_t nl;
         (nl = pending.find_first_of("\r\n", start)) != std::string::npos;
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
  // Readable once the rank has exited; -1 where pidfd_open is missing.
  int pidfd = -1;
  bool running = false;
  // Whether its process group (id `pid`) may still have members: children
  // it left behind outlive it there. Cleared once kill finds it gone.
  bool group = false;
  Stream out;
  Stream err;
  std::string prefix;
};

// The environment of local rank `local` of node `options.node_rank`: the
// launcher's, with the rendezvous variables replaced.
std::vector<std::string> RankEnvironment(
    const LaunchOptions& options, int local, const std::string& rendezvous,
    const std::string& job_id, const std::vector<std::string>& extra) {
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
  ours.insert(ours.end(), extra.begin(), extra.end());
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

// A TCP port of 127.0.0.1 free now (the kernel's pick), or 0.
int FreeLocalPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// What torchrun gives its workers beyond the rank variables, where the
// launcher's environment does not set them: on one node, a store address
// for torch.distributed's env:// initialization (MASTER_ADDR, a free
// MASTER_PORT); with several local ranks, OMP_NUM_THREADS=1.
std::vector<std::string> TorchrunDefaults(const LaunchOptions& options) {
  std::vector<std::string> defaults;
  auto unset = [](const char* name) {
    const char* value = getenv(name);
    return value == nullptr || *value == '\0';
  };
  if (options.num_nodes == 1 && unset("MASTER_ADDR") && unset("MASTER_PORT")) {
    if (const int port = FreeLocalPort(); port > 0) {
      defaults.push_back("MASTER_ADDR=127.0.0.1");
      defaults.push_back(absl::StrCat("MASTER_PORT=", port));
    }
  }
  if (options.num_ranks > 1 && unset("OMP_NUM_THREADS")) {
    defaults.push_back("OMP_NUM_THREADS=1");
  }
  return defaults;
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

// A descriptor that becomes readable when `pid` (a child) exits, or -1.
int OpenPidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  const long fd = syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    return static_cast<int>(fd);
  }
#endif
  return -1;
}

// Sends `sig` to the process group of `rank` (each rank leads its own),
// so that the children it started stop too, whether or not the rank itself
// has exited already. ESRCH: the group is gone, and is not signalled again
// (its id may be reused once empty).
void SignalRank(Rank& rank, int sig) {
  if (!rank.group) return;
  if (kill(-rank.pid, sig) == 0) return;
  if (errno == ESRCH) {
    rank.group = false;
    // A running rank that left its group (setsid) is still signalled.
    if (rank.running) kill(rank.pid, sig);
  }
}

// How many live (not zombie) processes each process group in `groups`
// holds, from one read of /proc; groups without one are absent. nullopt
// without /proc.
std::optional<std::map<pid_t, int>> LiveMembers(const std::set<pid_t>& groups) {
  std::map<pid_t, int> live;
  if (groups.empty()) return live;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return std::nullopt;
  while (const dirent* entry = readdir(proc)) {
    const char* name = entry->d_name;
    if (*name < '0' || *name > '9') continue;
    const int fd = open(absl::StrCat("/proc/", name, "/stat").c_str(),
                        O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // Gone meanwhile.
    char buf[512];
    const ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) continue;
    buf[n] = '\0';
    // "PID (COMM) STATE PPID PGRP ...": COMM may hold anything but ends
    // at the last ')'.
    const char* rest = strrchr(buf, ')');
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (rest == nullptr ||
        sscanf(rest + 1, " %c %d %d", &state, &ppid, &pgrp) != 3) {
      continue;
    }
    if (state != 'Z' && state != 'X' && groups.count(pgrp) > 0) ++live[pgrp];
  }
  closedir(proc);
  return live;
}

// Forgets the process groups of `ranks` that have no member left but
// zombies (orphans a slow init has not reaped yet: they can neither be
// stopped nor hold anything, and waiting for them would wait for the
// reaper). Returns whether any group has a live member. Reads /proc once
// when kill(2) alone cannot tell; without /proc, a group with zombies
// counts as live.
bool UpdateLiveGroups(std::vector<Rank>& ranks) {
  std::set<pid_t> unknown;  // Groups with members, perhaps only zombies.
  for (Rank& rank : ranks) {
    if (!rank.group) continue;
    if (kill(-rank.pid, 0) != 0 && errno == ESRCH) {
      rank.group = false;
    } else if (!rank.running) {
      unknown.insert(rank.pid);
    }
  }
  if (!unknown.empty()) {
    const std::optional<std::map<pid_t, int>> live = LiveMembers(unknown);
    if (!live.has_value()) return true;
    for (Rank& rank : ranks) {
      if (rank.group && !rank.running && live->count(rank.pid) == 0) {
        rank.group = false;
      }
    }
  }
  bool any = false;
  for (const Rank& rank : ranks) any |= rank.group;
  return any;
}

// Once every rank has exited and none failed: stops what is left in the
// ranks' process groups (a daemon, a data-loader worker that outlived its
// rank), which would otherwise outlive the job, saying on `stderr_fd` how
// many processes of which rank's group. Returns whether any was signalled.
bool StopStrays(std::vector<Rank>& ranks, int first_rank, int stderr_fd) {
  if (!UpdateLiveGroups(ranks)) return false;
  std::set<pid_t> groups;
  for (const Rank& rank : ranks) {
    if (rank.group) groups.insert(rank.pid);
  }
  const std::optional<std::map<pid_t, int>> live = LiveMembers(groups);
  for (size_t r = 0; r < ranks.size(); ++r) {
    Rank& rank = ranks[r];
    if (!rank.group) continue;
    const int count = !live.has_value()           ? -1
                      : live->count(rank.pid) > 0 ? live->at(rank.pid)
                                                  : 0;
    if (count == 0) continue;  // Exited since UpdateLiveGroups looked.
    WriteAll(stderr_fd,
             absl::StrFormat(
                 "[dcp_launch] every rank exited; stopping %s left in the "
                 "process group of rank %d\n",
                 count < 0    ? std::string("the processes")
                 : count == 1 ? std::string("1 process")
                              : absl::StrCat(count, " processes"),
                 first_rank + static_cast<int>(r)));
    SignalRank(rank, SIGTERM);
  }
  return true;
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
         "seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_option_function<double>(
         "--stray-wait-seconds",
         [options](double seconds) {
           options->stray_wait = absl::Seconds(seconds);
         },
         "after every rank exited 0: seconds what is left in their process "
         "groups may take to exit by itself before it is stopped (default 1)")
      ->check(CLI::NonNegativeNumber);
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

absl::StatusOr<int> Launch(const LaunchOptions& given) {
  LaunchOptions options = given;
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
  if (options.rendezvous.empty()) {
    if (const char* env = getenv("DCP_RENDEZVOUS"); env != nullptr) {
      options.rendezvous = env;
    }
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

  const std::vector<std::string> defaults = TorchrunDefaults(options);
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
        RankEnvironment(options, r, rendezvous, job_id, defaults);
    std::vector<std::string> args = options.command;
    std::vector<char*> envp = CStrings(env);
    std::vector<char*> argp = CStrings(args);
    std::fflush(nullptr);
    const pid_t launcher = getpid();
    // The forwarded signals are blocked across the fork: a child must not
    // take one with the launcher's handler (and lose it) before it has reset
    // its handlers; it then receives the pending signal as the default
    // action.
    sigset_t old_mask;
    pthread_sigmask(SIG_BLOCK, &forwarding.signals(), &old_mask);
    const pid_t pid = fork();
    if (pid != 0) pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    if (pid < 0) {
      start_error =
          absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
        close(fd);
      break;
    }
    if (pid == 0) {
      setpgid(0, 0);
      forwarding.ResetInChild();
      pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
      // A launcher killed outright (SIGKILL, a crash) cannot stop its
      // ranks: the kernel sends SIGTERM when it (the thread that forked)
      // dies. If it died before this was set, stop here.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != launcher) _exit(128 + SIGTERM);
      // Not the terminal: a rank reading it would be stopped (SIGTTIN, its
      // group is not the foreground one) and the job would wait forever.
      // torchrun's workers read /dev/null too.
      const int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, STDIN_FILENO);
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
    rank.pidfd = OpenPidfd(pid);
    rank.running = true;
    rank.group = true;
    rank.out = {out_pipe[0], options.stdout_fd, ""};
    rank.err = {err_pipe[0], options.stderr_fd, ""};
  }

  std::optional<int> first_failure;
  if (!start_error.ok()) first_failure = 1;
  std::optional<absl::Time> stop_started;
  // Whether the stop under way is that of a successful job's leftovers.
  bool stopping_strays = false;
  bool killed = false;
  // Stopping reaches the process groups of ranks that exited too: their
  // leftover children would otherwise outlive the launcher.
  auto stop_all = [&](int sig) {
    for (Rank& rank : ranks) SignalRank(rank, sig);
  };
  if (!start_error.ok()) {
    stop_started = absl::Now();
    stop_all(SIGTERM);
  }

  // The loop blocks in poll until a rank writes, exits (its pidfd) or the
  // launcher gets a signal (the wake-up pipe), or until the next deadline:
  // the end of the grace period, the end of the wait for leftover pipes.
  // It never spins, whatever the ranks did with their stdout and stderr.
  std::optional<absl::Time> all_exited_at;
  absl::Duration timeout = absl::InfiniteDuration();
  for (;;) {
    std::vector<pollfd> fds;
    for (Rank& rank : ranks) {
      for (Stream* s : {&rank.out, &rank.err}) {
        if (s->fd >= 0) fds.push_back({s->fd, POLLIN, 0});
      }
      if (rank.running && rank.pidfd >= 0) {
        fds.push_back({rank.pidfd, POLLIN, 0});
      }
    }
    if (forwarding.wake_fd() >= 0) {
      fds.push_back({forwarding.wake_fd(), POLLIN, 0});
    }
    const int timeout_ms = timeout == absl::InfiniteDuration()
                               ? -1
                               : static_cast<int>(std::clamp<int64_t>(
                                     absl::ToInt64Milliseconds(absl::Ceil(
                                         timeout, absl::Milliseconds(1))),
                                     0, 60000));
    poll(fds.data(), fds.size(), timeout_ms);
    forwarding.Drain();
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
      if (rank.pidfd >= 0) close(rank.pidfd);
      rank.pidfd = -1;
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
    if (g_signal != 0 && (!stop_started.has_value() || stopping_strays)) {
      if (!first_failure.has_value()) first_failure = 128 + g_signal;
      if (!stop_started.has_value()) {
        stop_started = absl::Now();
        stop_all(SIGTERM);
      }
      stopping_strays = false;
    }
    const absl::Time now = absl::Now();
    if (!any_running && !all_exited_at.has_value()) all_exited_at = now;
    // A successful job's leftovers get stray_wait to exit on their own,
    // then are stopped the same way (SIGTERM, then SIGKILL after the grace
    // period); the exit code stays 0.
    bool strays_waited_for = false;
    if (!any_running && !stop_started.has_value()) {
      if (now < *all_exited_at + options.stray_wait) {
        strays_waited_for = UpdateLiveGroups(ranks);
      } else if (StopStrays(ranks, options.node_rank * options.num_ranks,
                            options.stderr_fd)) {
        stop_started = now;
        stopping_strays = true;
      }
    }
    if (stop_started.has_value() && !killed &&
        now - *stop_started >= options.grace) {
      stop_all(SIGKILL);
      killed = true;
    }
    // While stopping, the leftover children of exited ranks are waited for
    // too (until SIGKILL, which they cannot survive, has been sent).
    const bool groups_left =
        stop_started.has_value() && !killed && UpdateLiveGroups(ranks);
    bool open = false;
    for (const Rank& rank : ranks) {
      open |= rank.out.fd >= 0 || rank.err.fd >= 0;
    }
    // Leftover children of a rank may hold its pipes; stop waiting soon.
    const absl::Time pipes_deadline =
        all_exited_at.value_or(now) + absl::Seconds(1);
    if (!any_running && !groups_left && !strays_waited_for &&
        (!open || now >= pipes_deadline)) {
      break;
    }

    // How long the next poll may block.
    timeout = absl::InfiniteDuration();
    bool unwatched = forwarding.wake_fd() < 0;
    for (const Rank& rank : ranks) unwatched |= rank.running && rank.pidfd < 0;
    // Without a pidfd or a wake-up pipe, and for leftover children (whose
    // end nothing notifies), look again shortly.
    if (unwatched) timeout = absl::Milliseconds(50);
    if (groups_left || strays_waited_for) {
      timeout = std::min(timeout, absl::Milliseconds(20));
    }
    if (stop_started.has_value() && !killed) {
      timeout = std::min(timeout, *stop_started + options.grace - now);
    }
    if (!any_running && open) {
      timeout = std::min(timeout, pipes_deadline - now);
    }
    timeout = std::max(timeout, absl::ZeroDuration());
  }
  for (Rank& rank : ranks) {
    if (rank.pidfd >= 0) close(rank.pidfd);
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
