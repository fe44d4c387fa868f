#include "tests/comm/multiprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace dcp::testing {

std::vector<RankExit> RunRanks(int n, const std::function<int(int rank)>& body,
                               absl::Duration deadline_after) {
  std::fflush(nullptr);
  std::vector<pid_t> pids(n, -1);
  // A pidfd per child becomes readable when it exits: the parent sleeps in
  // poll until one does or the deadline passes.
  std::vector<int> pidfds(n, -1);
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int rc = 2;
      rc = body(r);
      std::fflush(nullptr);
      _exit(rc);
    }
    pids[r] = pid;
    if (pid > 0) {
      pidfds[r] = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
      if (pidfds[r] < 0) {
        std::fprintf(stderr, "pidfd_open(%d): %s\n", pid, std::strerror(errno));
        for (int k = 0; k <= r; ++k) {
          if (pids[k] > 0) kill(pids[k], SIGKILL);
        }
        std::abort();
      }
    }
  }
  std::vector<RankExit> exits(n);
  const absl::Time deadline = absl::Now() + deadline_after;
  auto reap = [&](int r, int flags) {
    int status = 0;
    if (waitpid(pids[r], &status, flags) != pids[r]) return false;
    if (WIFEXITED(status)) {
      exits[r].exited = true;
      exits[r].exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      exits[r].signal = WTERMSIG(status);
    }
    pids[r] = -1;
    return true;
  };
  while (true) {
    std::vector<pollfd> waiting;
    std::vector<int> ranks;
    for (int r = 0; r < n; ++r) {
      if (pids[r] < 0 || pidfds[r] < 0) continue;
      waiting.push_back({pidfds[r], POLLIN, 0});
      ranks.push_back(r);
    }
    const absl::Duration left = deadline - absl::Now();
    if (waiting.empty() || left <= absl::ZeroDuration()) break;
    const int ready =
        poll(waiting.data(), waiting.size(),
             static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) break;
    for (size_t k = 0; k < waiting.size(); ++k) {
      if (waiting[k].revents == 0) continue;
      // Not ours to reap any more (ECHILD): counted as gone.
      if (!reap(ranks[k], 0) && errno == ECHILD) pids[ranks[k]] = -1;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (pidfds[r] >= 0) close(pidfds[r]);
    if (pids[r] < 0) continue;
    if (reap(r, WNOHANG)) continue;
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

bool ReadUntil(int fd, absl::string_view wanted, absl::Time deadline,
               std::string* out, bool* eof) {
  if (eof != nullptr) *eof = false;
  char buffer[4096];
  while (!absl::StrContains(*out, wanted)) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd readable = {fd, POLLIN, 0};
    const int ready = poll(
        &readable, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 && eof != nullptr) *eof = true;
    if (n <= 0) return false;
    out->append(buffer, static_cast<size_t>(n));
  }
  return true;
}

namespace {

// A port nobody listens on right now (the kernel's pick).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Whether a redis server answers PING on `port` (a listener of another
// test that took the port first would not).
bool AnswersPing(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  timeval limit = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  constexpr char kPing[] = "PING\r\n";
  ok = ok && send(fd, kPing, sizeof(kPing) - 1, MSG_NOSIGNAL) ==
                 static_cast<ssize_t>(sizeof(kPing) - 1);
  std::string reply;
  char buffer[16];
  while (ok && reply.size() < 7) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return ok && reply.rfind("+PONG\r\n", 0) == 0;
}

}  // namespace

std::unique_ptr<RedisServer> RedisServer::StartIfInstalled(std::string* why_not,
                                                           bool* broken) {
  *broken = false;
  std::string binary;
  for (const char* path :
       {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (access(path, X_OK) == 0) binary = path;
  }
  if (binary.empty()) {
    *why_not = "redis-server is not installed (apt-get install redis-server)";
    return nullptr;
  }
  *broken = true;
  // The port is free when picked but another test's listener may take it
  // before redis binds it: redis then exits, and another port is tried.
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int port = FreePort();
    const std::string port_arg = std::to_string(port);
    int log[2];
    if (pipe2(log, O_CLOEXEC) != 0) {
      *why_not = absl::StrCat("pipe: ", std::strerror(errno));
      return nullptr;
    }
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      *why_not = absl::StrCat("fork for ", binary, ": ", std::strerror(errno));
      close(log[0]);
      close(log[1]);
      return nullptr;
    }
    if (pid == 0) {
      // redis logs to stdout (and ignores SIGPIPE once the parent stops
      // reading).
      dup2(log[1], STDOUT_FILENO);
      dup2(log[1], STDERR_FILENO);
      execl(binary.c_str(), binary.c_str(), "--port", port_arg.c_str(),
            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--daemonize", "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(log[1]);
    std::unique_ptr<RedisServer> server(new RedisServer(pid, port));
    // Redis logs this line once it listens; the deadline only bounds a
    // hang.
    std::string output;
    bool eof = false;
    const bool ready =
        ReadUntil(log[0], "Ready to accept connections",
                  absl::Now() + absl::Seconds(30), &output, &eof);
    close(log[0]);
    if (ready && AnswersPing(port)) {
      *broken = false;
      return server;
    }
    if (ready) {
      *why_not = absl::StrCat(binary, " is ready on port ", port,
                              " but does not answer PING");
      return nullptr;
    }
    if (!eof) {
      *why_not = absl::StrCat(binary, " did not get ready on port ", port,
                              " within 30 s; it printed:\n", output);
      return nullptr;
    }
    // The end of its output: redis is exiting (it may not be reapable yet).
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) {
      *why_not = absl::StrCat("waitpid ", binary, ": ", std::strerror(errno));
      return nullptr;
    }
    server->pid_ = -1;  // Reaped: nothing to stop.
    *why_not = absl::StrCat(
        binary, " exited (",
        WIFEXITED(status) ? absl::StrCat("code ", WEXITSTATUS(status))
                          : absl::StrCat("signal ", WTERMSIG(status)),
        ") before getting ready on port ", port, "; it printed:\n", output);
    if (output.find("Address already in use") == std::string::npos) {
      return nullptr;
    }
  }
  return nullptr;
}

RedisServer::~RedisServer() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
}

std::string RedisServer::address() const {
  return absl::StrCat("redis://127.0.0.1:", port_);
}

}  // namespace dcp::testing
