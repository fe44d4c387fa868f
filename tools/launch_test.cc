// Tests of the launcher's supervision (tools/launch.h): it stops the
// children a failed or a successful rank left behind, forwards SIGHUP and
// SIGQUIT, and its ranks stop when it is killed outright. (That it blocks
// rather than spins once the ranks closed their output is a matter of CPU time,
// which tests do not measure.) (tests/comm/launch_test.cc covers the rest.)
#include "tools/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dcp::tools {
namespace {

// A fresh directory under the test's temporary directory.
std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp",
                                       "/launch_test_", name, "_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

LaunchOptions Options(int n, std::vector<std::string> command) {
  LaunchOptions options;
  options.num_ranks = n;
  options.command = std::move(command);
  options.grace = absl::Seconds(5);
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  options.stdout_fd = null;
  options.stderr_fd = null;
  return options;
}

// Waits (a notification, not a sleep: poll on a pidfd) until process `pid`
// has terminated, for at most `limit`. True when it has (or is gone).
bool WaitForExit(pid_t pid, absl::Duration limit) {
  const long fd = syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) return errno == ESRCH;
  pollfd p = {static_cast<int>(fd), POLLIN, 0};
  int ready;
  do {
    ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(limit)));
  } while (ready < 0 && errno == EINTR);
  close(static_cast<int>(fd));
  return ready == 1;
}

// The process id `path` holds (written by a rank), or -1.
pid_t ReadPid(const std::string& path) {
  std::ifstream in(path);
  pid_t pid = -1;
  in >> pid;
  return pid;
}

// A rank that fails leaves a child in its process group (a data-loader
// worker, a wrapper script's child); stopping the job stops it too.
TEST(LaunchSupervisionTest, StopsChildrenAFailedRankLeftBehind) {
  const std::string dir = FreshDir("leftover");
  const std::string pid_file = dir + "/child.pid";
  const LaunchOptions options = Options(
      1, {"/bin/sh", "-c",
          absl::StrCat("sleep 1000 & echo $! > ", pid_file, "; exit 3")});
  absl::StatusOr<int> code = Launch(options);
  close(options.stdout_fd);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3);
  const pid_t child = ReadPid(pid_file);
  ASSERT_GT(child, 0);
  const bool exited = WaitForExit(child, absl::Seconds(20));
  EXPECT_TRUE(exited) << "the rank's child " << child << " still runs";
  if (!exited) kill(child, SIGKILL);
}

// Launch with the launcher's own stderr lines captured in `*err`.
absl::StatusOr<int> LaunchCapturingStderr(LaunchOptions options,
                                          const std::string& dir,
                                          std::string* err) {
  const std::string err_file = dir + "/stderr";
  close(options.stderr_fd);
  options.stderr_fd =
      open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (options.stderr_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", err_file));
  }
  absl::StatusOr<int> code = Launch(options);
  close(options.stdout_fd);
  close(options.stderr_fd);
  std::ifstream in(err_file);
  err->assign(std::istreambuf_iterator<char>(in),
              std::istreambuf_iterator<char>());
  return code;
}

// A rank that succeeds but leaves a child in its process group (a daemon, a
// worker that outlived it): once every rank has exited the launcher stops
// the child, says so on stderr, and still exits 0.
TEST(LaunchSupervisionTest, StopsChildrenASuccessfulRankLeftBehind) {
  const std::string dir = FreshDir("leftover_ok");
  const std::string pid_file = dir + "/child.pid";
  const LaunchOptions options = Options(
      2, {"/bin/sh", "-c",
          absl::StrCat("if [ \"$DCP_RANK\" = 1 ]; then sleep 1000 & echo $! > ",
                       pid_file, "; fi; exit 0")});
  std::string err;
  absl::StatusOr<int> code = LaunchCapturingStderr(options, dir, &err);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  const pid_t child = ReadPid(pid_file);
  ASSERT_GT(child, 0);
  // Launch returns once the child is gone; the limit only bounds a hang.
  const bool exited = WaitForExit(child, absl::Seconds(20));
  EXPECT_TRUE(exited) << "the rank's child " << child << " still runs";
  if (!exited) kill(child, SIGKILL);
  EXPECT_EQ(err,
            "[dcp_launch] every rank exited; stopping 1 process left in the "
            "process group of rank 1\n");
}

// A child that exits by itself once its rank is gone (as Python's resource
// tracker does when its pipe closes) is left to do so: no signal, no word
// on stderr. stray_wait is long here so that only a hang could fail it;
// Launch returns once the child's group is empty.
TEST(LaunchSupervisionTest, LetsAChildThatEndsWithItsRankEndByItself) {
  const std::string dir = FreshDir("leftover_ends");
  const std::string done_file = dir + "/done";
  LaunchOptions options =
      Options(1, {"/bin/bash", "-c",
                  absl::StrCat("exec 3> >(cat > /dev/null; echo done > ",
                               done_file, "); exit 0")});
  options.stray_wait = absl::Seconds(60);
  std::string err;
  absl::StatusOr<int> code = LaunchCapturingStderr(options, dir, &err);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  std::ifstream done(done_file);
  std::string word;
  done >> word;
  EXPECT_EQ(word, "done") << "the child did not end by itself";
  EXPECT_EQ(err, "");
}

// SIGHUP and SIGQUIT sent to the launcher stop the ranks like SIGINT and
// SIGTERM, and the launcher exits 128 + the signal (rather than dying of
// the signal's default action). The rank itself signals the launcher.
TEST(LaunchSupervisionTest, ForwardsHangupAndQuit) {
  for (const int sig : {SIGHUP, SIGQUIT}) {
    SCOPED_TRACE(sig);
    // Caught only when not ignored on entry.
    signal(sig, SIG_DFL);
    const LaunchOptions options =
        Options(2, {"/bin/sh", "-c",
                    absl::StrCat("if [ \"$DCP_RANK\" = 0 ]; then kill -", sig,
                                 " $PPID; fi; exec sleep 600")});
    const absl::Time start = absl::Now();
    absl::StatusOr<int> code = Launch(options);
    close(options.stdout_fd);
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 128 + sig);
    EXPECT_LT(absl::Now() - start, absl::Seconds(120));
  }
}

// A launcher killed with SIGKILL cannot stop its ranks itself; the kernel
// does (PR_SET_PDEATHSIG).
TEST(LaunchSupervisionTest, RanksStopWhenTheLauncherIsKilled) {
  const std::string dir = FreshDir("orphan");
  const std::string fifo = dir + "/rank.pid";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << fifo;
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    const LaunchOptions options =
        Options(1, {"/bin/sh", "-c",
                    absl::StrCat("echo $$ > ", fifo, "; exec sleep 600")});
    absl::StatusOr<int> code = Launch(options);
    _exit(code.ok() ? *code : 1);
  }
  // Blocks until the rank has started (and writes its pid).
  const pid_t rank = ReadPid(fifo);
  ASSERT_GT(rank, 0);
  kill(launcher, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  const bool exited = WaitForExit(rank, absl::Seconds(20));
  EXPECT_TRUE(exited) << "rank " << rank << " outlived its launcher";
  if (!exited) kill(rank, SIGKILL);
}

}  // namespace
}  // namespace dcp::tools
