#include "tests/comm/multiprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dcp::testing {

std::vector<RankExit> RunRanks(int n, const std::function<int(int rank)>& body,
                               absl::Duration deadline_after) {
  std::fflush(nullptr);
  std::vector<pid_t> pids(n, -1);
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int rc = 2;
      rc = body(r);
      std::fflush(nullptr);
      _exit(rc);
    }
    pids[r] = pid;
  }
  std::vector<RankExit> exits(n);
  int remaining = n;
  const absl::Time deadline = absl::Now() + deadline_after;
  while (remaining > 0 && absl::Now() < deadline) {
    for (int r = 0; r < n; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      if (WIFEXITED(status)) {
        exits[r].exited = true;
        exits[r].exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        exits[r].signal = WTERMSIG(status);
      }
      pids[r] = -1;
      --remaining;
    }
    usleep(5000);
  }
  for (int r = 0; r < n; ++r) {
    if (pids[r] < 0) continue;
    kill(pids[r], SIGKILL);
    int status = 0;
    waitpid(pids[r], &status, 0);
    exits[r].timed_out = true;
  }
  return exits;
}

std::string FreshTestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

int Check(bool ok, int rank, const std::string& message) {
  if (ok) return 0;
  std::fprintf(stderr, "[rank %d] check failed: %s\n", rank, message.c_str());
  return 1;
}

}  // namespace dcp::testing
