#include "tests/comm/multiprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

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

std::unique_ptr<RedisServer> RedisServer::StartIfInstalled(
    std::string* why_not) {
  std::string binary;
  for (const char* path :
       {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (access(path, X_OK) == 0) binary = path;
  }
  if (binary.empty()) {
    *why_not = "redis-server is not installed (apt-get install redis-server)";
    return nullptr;
  }
  // The port is free when picked but another test's listener may take it
  // before redis binds it: redis then exits, and another port is tried.
  std::string last_failure;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int port = FreePort();
    const std::string port_arg = std::to_string(port);
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      *why_not = absl::StrCat("fork for ", binary, ": ", std::strerror(errno));
      return nullptr;
    }
    if (pid == 0) {
      const int null_fd = open("/dev/null", O_WRONLY);
      dup2(null_fd, STDOUT_FILENO);
      execl(binary.c_str(), binary.c_str(), "--port", port_arg.c_str(),
            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--daemonize", "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    std::unique_ptr<RedisServer> server(new RedisServer(pid, port));
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    bool exited = false;
    while (!AnswersPing(port)) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        server->pid_ = -1;  // Reaped: nothing to stop.
        exited = true;
        last_failure = absl::StrCat(
            binary, " exited (",
            WIFEXITED(status) ? absl::StrCat("code ", WEXITSTATUS(status))
                              : absl::StrCat("signal ", WTERMSIG(status)),
            ") before answering on port ", port);
        break;
      }
      if (absl::Now() > deadline) {
        *why_not = absl::StrCat(binary, " did not answer PING on port ", port,
                                " within 30 s");
        return nullptr;
      }
      usleep(10000);
    }
    if (!exited) return server;
  }
  *why_not = last_failure;
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
