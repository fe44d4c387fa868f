#include "bench/bench_env.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace dcp {

namespace fs = std::filesystem;

absl::StatusOr<ProcessRun> RunProcess(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoError(errno, "pipe2");
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return ErrnoError(error, "fork");
  }
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  ProcessRun run;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      run.out.append(buffer, n);
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  struct rusage usage {};
  while (::wait4(pid, &status, 0, &usage) < 0) {
    if (errno != EINTR) return ErrnoError(errno, "wait4");
  }
  run.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.max_rss = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  run.user_seconds = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6;
  run.system_seconds = usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6;
  return run;
}

absl::StatusOr<nlohmann::json> RunJsonProcess(
    const std::vector<std::string>& argv, ProcessRun* run) {
  DCP_ASSIGN_OR_RETURN(ProcessRun done, RunProcess(argv));
  if (done.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat("`", absl::StrJoin(argv, " "), "` failed with exit code ",
                     done.exit_code, " (its stderr is above)"));
  }
  // The whole output (fio), else its last line (the others).
  nlohmann::json parsed = nlohmann::json::parse(done.out, nullptr, false);
  if (parsed.is_discarded()) {
    const size_t end = done.out.find_last_not_of("\n");
    const size_t start = end == std::string::npos || end == 0
                             ? 0
                             : done.out.rfind('\n', end) + 1;
    parsed = nlohmann::json::parse(done.out.substr(start), nullptr, false);
  }
  if (parsed.is_discarded()) {
    return absl::InternalError(absl::StrCat("`", absl::StrJoin(argv, " "),
                                            "` printed no JSON: ", done.out));
  }
  if (run != nullptr) *run = std::move(done);
  return parsed;
}

std::string BenchFile(const std::string& name) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) candidates.push_back(self.string() + ".runfiles/dcp/bench/" + name);
  if (const char* dir = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(fs::path(dir) / "dcp/bench" / name);
  }
  candidates.push_back(fs::path("bench") / name);
  for (const fs::path& p : candidates) {
    if (fs::exists(p, ec)) return fs::canonical(p, ec).string();
  }
  return (fs::path("bench") / name).string();
}

absl::StatusOr<std::string> MakeWorkDir(const std::string& parent,
                                        const std::string& prefix) {
  std::error_code ec;
  fs::create_directories(parent, ec);
  std::string pattern = absl::StrCat(parent, "/", prefix, "XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    return ErrnoError(errno, absl::StrCat("mkdtemp ", pattern));
  }
  return pattern;
}

nlohmann::json SourceCommit() {
  // torch_env.sh is a runfile of every bench program that runs torch; its
  // canonical path is in the source tree.
  const std::string root =
      fs::path(BenchFile("torch_env.sh")).parent_path().parent_path().string();
  absl::StatusOr<ProcessRun> commit =
      RunProcess({"git", "-C", root, "rev-parse", "--short", "HEAD"});
  absl::StatusOr<ProcessRun> dirty = RunProcess(
      {"git", "-C", root, "status", "--porcelain", "--untracked-files=no"});
  nlohmann::json out = nlohmann::json::object();
  if (commit.ok() && commit->exit_code == 0) {
    out["commit"] = std::string(absl::StripAsciiWhitespace(commit->out));
    out["tree_modified"] = dirty.ok() && !dirty->out.empty();
  }
  return out;
}

int64_t PeakRssSelf() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

nlohmann::json MachineJson(const MachineInfo& machine) {
  return {{"cpu_model", machine.cpu_model},
          {"cpus", machine.cpus},
          {"memory_bytes", machine.memory_bytes},
          {"kernel", machine.kernel},
          {"file_system", machine.file_system},
          {"block_device", machine.block_device},
          {"scheduler", machine.scheduler},
          {"read_ahead_kb", machine.read_ahead_kb},
          {"rotational", machine.rotational}};
}

std::string NowUtc() {
  std::time_t now = std::time(nullptr);
  char text[64];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  return text;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return absl::StrCat(one, " ", five, " ", fifteen);
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace dcp
