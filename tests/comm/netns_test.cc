// Ranks on separate "nodes": network namespaces joined by veth pairs to a
// bridge in a namespace of their own (issue 26). Each node's launcher runs
// in its namespace with DCP_COMM_ADDR set to that node's address, so Gloo
// traffic crosses the veth links, and redis runs in node 0's namespace.
//   - 2 nodes x 2 ranks save a checkpoint split by rows; 3 nodes x 1 rank
//     load it split by columns (every element checked); then a second save
//     and load against the same redis succeed.
//   - the same through a shared rendezvous directory, the second time
//     with ranks choosing their interface by name (DCP_SOCKET_IFNAME).
//   - node 1's link cut before a save: the saves fail within the timeout,
//     every reporting rank names the other node's ranks and address, both
//     launchers exit non-zero, the previous checkpoint still loads.
// The test makes its namespaces and removes them afterwards; it skips,
// saying why, where namespaces cannot be made (not root, no `ip`).
#include "bench/coord/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"
#include "tools/launch.h"

namespace dcp::testing {
namespace {

constexpr int kNodes = 3;

using Namespaces = NetworkNamespaces;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// redis-server in node 0's namespace, on node 0's address.
class NamespacedRedis {
 public:
  NamespacedRedis(const Namespaces& ns) : ns_(ns) {}
  ~NamespacedRedis() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }

  bool Start(std::string* why_not) {
    if (access("/usr/bin/redis-server", X_OK) != 0) {
      *why_not = "redis-server is not installed";
      return false;
    }
    int log[2];
    if (pipe2(log, O_CLOEXEC) != 0) {
      *why_not = std::string("pipe: ") + std::strerror(errno);
      return false;
    }
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      if (!ns_.Enter(0).ok()) _exit(90);
      dup2(log[1], STDOUT_FILENO);
      dup2(log[1], STDERR_FILENO);
      // Protected mode refuses peers off loopback; this server is reachable
      // only from the test's namespaces (the bridge has no uplink).
      const std::string bind = Namespaces::Address(0);
      execl("/usr/bin/redis-server", "redis-server", "--port", "6379", "--bind",
            bind.c_str(), "--save", "", "--appendonly", "no", "--daemonize",
            "no", "--protected-mode", "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(log[1]);
    // Redis logs this line once it listens (and ignores SIGPIPE once the
    // pipe is closed); the deadline only bounds a hang.
    std::string out;
    const bool ready =
        dcp::testing::ReadUntil(log[0], "Ready to accept connections",
                                absl::Now() + absl::Seconds(30), &out);
    close(log[0]);
    if (!ready) {
      *why_not = "redis in the namespace did not get ready: " + out;
      return false;
    }
    // A ping from another node shows the link works (TCP retries its
    // connect while the bridge port comes up; a refused or unreachable
    // connect fails at once and is tried again, a few times).
    const std::string ping =
        absl::StrCat("ip netns exec ", ns_.Node(1), " timeout 60 redis-cli -h ",
                     Namespaces::Address(0), " ping");
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (RunShell(ping, &out) == 0 && out.find("PONG") != std::string::npos) {
        return true;
      }
    }
    *why_not = "redis in the namespace did not answer: " + out;
    return false;
  }

  std::string address() const {
    return absl::StrCat("redis://", Namespaces::Address(0), ":6379");
  }

 private:
  const Namespaces& ns_;
  pid_t pid_ = -1;
};

// In a child process: enters node `node`'s namespace and runs its launcher
// of `per_node` ranks of save_rank_main MODE CHECKPOINT, listening on the
// node's address (given as DCP_COMM_ADDR, or `by_interface` as
// DCP_SOCKET_IFNAME). The launcher's output goes to `out_fd`/`err_fd`.
// Returns the launcher's exit code.
int RunNode(const Namespaces& ns, int node, int nodes, int per_node,
            const std::string& rendezvous, const std::string& mode,
            const std::string& checkpoint, bool by_interface,
            const std::string& job_id, int out_fd = 1, int err_fd = 2) {
  if (absl::Status s = ns.Enter(node); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 90;
  }
  if (by_interface) {
    unsetenv("DCP_COMM_ADDR");
    setenv("DCP_SOCKET_IFNAME", absl::StrCat("v", node).c_str(), 1);
  } else {
    setenv("DCP_COMM_ADDR", Namespaces::Address(node).c_str(), 1);
  }
  unsetenv("DCP_JOB_ID");
  tools::LaunchOptions options;
  options.num_ranks = per_node;
  options.num_nodes = nodes;
  options.node_rank = node;
  options.rendezvous = rendezvous;
  options.job_id = job_id;
  options.grace = absl::Seconds(2);
  options.stdout_fd = out_fd;
  options.stderr_fd = err_fd;
  options.command = {"tests/comm/save_rank_main", mode, checkpoint};
  absl::StatusOr<int> code = tools::Launch(options);
  if (!code.ok()) {
    std::fprintf(stderr, "%s\n", code.status().ToString().c_str());
    return 100;
  }
  return *code;
}

// Runs `nodes` launchers of `per_node` ranks each of save_rank_main MODE
// CHECKPOINT, node i in namespace i (see RunNode); expects every launcher
// to exit 0.
void RunJob(const Namespaces& ns, int nodes, int per_node,
            const std::string& rendezvous, const std::string& mode,
            const std::string& checkpoint, bool by_interface = false) {
  std::vector<RankExit> exits = RunRanks(
      nodes,
      [&](int node) -> int {
        return RunNode(ns, node, nodes, per_node, rendezvous, mode, checkpoint,
                       by_interface, /*job_id=*/"");
      },
      absl::Seconds(90));
  for (int node = 0; node < nodes; ++node) {
    EXPECT_TRUE(exits[node].exited && exits[node].exit_code == 0)
        << mode << " on " << nodes << " x " << per_node << ": node " << node
        << " exited " << exits[node].exit_code << " signal "
        << exits[node].signal << (exits[node].timed_out ? " (timed out)" : "");
  }
}

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = ns_.Make(); !s.ok()) GTEST_SKIP() << s.message();
  }
  Namespaces ns_{kNodes};
};

TEST_F(NetnsTest, TwoByTwoSaveThreeByOneLoadOverRedis) {
  NamespacedRedis redis(ns_);
  std::string why_not;
  ASSERT_TRUE(redis.Start(&why_not)) << why_not;
  const std::string checkpoint = FreshTestDir("netns-redis-ckpt");
  RunJob(ns_, 2, 2, redis.address(), "save", checkpoint);
  RunJob(ns_, 3, 1, redis.address(), "load", checkpoint);
  // Later jobs against the same redis.
  RunJob(ns_, 2, 2, redis.address(), "save", checkpoint + "-2");
  RunJob(ns_, 3, 1, redis.address(), "load", checkpoint + "-2");
}

TEST_F(NetnsTest, TwoByTwoSaveThreeByOneLoadOverADirectory) {
  const std::string rendezvous = FreshTestDir("netns-rendezvous");
  const std::string checkpoint = FreshTestDir("netns-dir-ckpt");
  RunJob(ns_, 2, 2, rendezvous, "save", checkpoint);
  RunJob(ns_, 3, 1, rendezvous, "load", checkpoint);
  // Ranks that choose their interface by name instead of address.
  RunJob(ns_, 2, 2, rendezvous, "save", checkpoint + "-2",
         /*by_interface=*/true);
  RunJob(ns_, 3, 1, rendezvous, "load", checkpoint + "-2",
         /*by_interface=*/true);
}

// Node 1's link goes down after every rank has joined and before the save:
// the saves fail within the timeout, every reporting rank names the ranks
// it lost, both launchers exit non-zero, and the checkpoint saved before
// still loads (link back up). `rendezvous` is a shared directory (both
// nodes still reach it) or redis on node 0 (node 1 loses it too).
void CutLinkMidSave(const Namespaces& ns_, const std::string& rendezvous,
                    const std::string& name) {
  const std::string checkpoint = FreshTestDir(name + "-ckpt");
  const std::string gate = FreshTestDir(name + "-gate");
  const std::string logs = FreshTestDir(name + "-logs");
  RunJob(ns_, 2, 2, rendezvous, "save", checkpoint);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_EQ(mkfifo(absl::StrCat(gate, "/rank", rank).c_str(), 0600), 0);
  }
  // Processes 0 and 1 are the nodes; process 2 opens each rank's gate (which
  // returns once that rank has joined), cuts node 1's link, then lets every
  // rank go on into its save.
  std::vector<RankExit> exits = RunRanks(
      3,
      [&](int i) -> int {
        if (i < 2) {
          setenv("DCP_TEST_GATE_DIR", gate.c_str(), 1);
          setenv("DCP_TEST_TIMEOUT_MS", "3000", 1);
          const std::string base = absl::StrCat(logs, "/node", i);
          const int out =
              open((base + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
          const int err =
              open((base + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
          return RunNode(ns_, i, 2, 2, rendezvous, "save", checkpoint,
                         /*by_interface=*/false, "cut-job", out, err);
        }
        std::vector<int> fds;
        for (int rank = 0; rank < 4; ++rank) {
          fds.push_back(
              open(absl::StrCat(gate, "/rank", rank).c_str(), O_WRONLY));
        }
        std::string out;
        if (RunShell(absl::StrCat("ip -n ", ns_.Node(1), " link set v1 down"),
                     &out) != 0) {
          std::fprintf(stderr, "cannot cut the link: %s\n", out.c_str());
          return 1;
        }
        for (int fd : fds) {
          if (fd < 0 || write(fd, "g", 1) != 1) return 2;
          close(fd);
        }
        return 0;
      },
      absl::Seconds(60));
  EXPECT_TRUE(exits[2].exited && exits[2].exit_code == 0);
  for (int node = 0; node < 2; ++node) {
    const std::string err = ReadFile(absl::StrCat(logs, "/node", node, ".err"));
    EXPECT_TRUE(exits[node].exited && exits[node].exit_code != 0)
        << "node " << node << " exited " << exits[node].exit_code << ": "
        << err;
    // Every rank that reports (the launcher stops a node's other ranks
    // after its first failure) fails its save with a timeout or a lost
    // connection, and names the other node's ranks with their address,
    // whichever rank it was waiting for: its probe of each peer finds the
    // other node unreachable.
    const int other = 1 - node;
    int reports = 0;
    for (absl::string_view line : absl::StrSplit(err, '\n')) {
      if (!absl::StrContains(line, "save: ")) continue;
      ++reports;
      EXPECT_TRUE(absl::StrContains(line, "DEADLINE_EXCEEDED") ||
                  absl::StrContains(line, "UNAVAILABLE"))
          << "node " << node << ": " << line;
      for (int rank : {2 * other, 2 * other + 1}) {
        EXPECT_TRUE(absl::StrContains(
            line, absl::StrCat("rank ", rank, " at ",
                               Namespaces::Address(other), " (unreachable")))
            << "node " << node << " does not name rank " << rank << ": "
            << line;
      }
      // Its own node's ranks answer, or are gone once they reported and
      // exited; they are never unreachable.
      for (int rank : {2 * node, 2 * node + 1}) {
        EXPECT_FALSE(absl::StrContains(
            line, absl::StrCat("rank ", rank, " at ", Namespaces::Address(node),
                               " (unreachable")))
            << "node " << node << " finds its own rank " << rank
            << " unreachable: " << line;
      }
    }
    EXPECT_GE(reports, 1) << "node " << node << ": " << err;
    std::fprintf(stderr, "node %d:\n%s\n", node, err.c_str());
  }
  ASSERT_EQ(RunShell(absl::StrCat("ip -n ", ns_.Node(1), " link set v1 up")),
            0);
  RunJob(ns_, 3, 1, rendezvous, "load", checkpoint);
}

TEST_F(NetnsTest, LinkCutMidSaveOverADirectory) {
  CutLinkMidSave(ns_, FreshTestDir("netns-cut-rendezvous"), "netns-cut-dir");
}

// Node 1 loses redis with the link: its ranks' store commands time out
// (bounded, see comm/internal/gloo_store.cc) instead of hanging.
TEST_F(NetnsTest, LinkCutMidSaveOverRedis) {
  NamespacedRedis redis(ns_);
  std::string why_not;
  ASSERT_TRUE(redis.Start(&why_not)) << why_not;
  CutLinkMidSave(ns_, redis.address(), "netns-cut-redis");
}

}  // namespace
}  // namespace dcp::testing
