// Tests of the local launcher (tools/launch.h): environment, output
// prefixes, failure propagation, stopping the other ranks, and a real
// Gloo job started through it.
#include "tools/launch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"

namespace dcp::tools {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

struct Captured {
  absl::StatusOr<int> code;
  std::vector<std::string> out;  // Lines of stdout.
  std::vector<std::string> err;  // Lines of stderr.
  absl::Duration took;
};

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

Captured RunLauncher(const std::string& name, int n,
                     std::vector<std::string> command,
                     absl::Duration grace = absl::Seconds(5)) {
  const std::string dir = dcp::testing::FreshTestDir(name);
  const std::string out_path = dir + "/out", err_path = dir + "/err";
  const int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  LaunchOptions options;
  options.num_ranks = n;
  options.command = std::move(command);
  options.grace = grace;
  options.stdout_fd = out_fd;
  options.stderr_fd = err_fd;
  const absl::Time start = absl::Now();
  Captured c{Launch(options), {}, {}, absl::ZeroDuration()};
  c.took = absl::Now() - start;
  close(out_fd);
  close(err_fd);
  c.out = ReadLines(out_path);
  c.err = ReadLines(err_path);
  return c;
}

TEST(LaunchTest, SetsEnvironmentAndPrefixesEveryLine) {
  Captured c =
      RunLauncher("env", 3,
                  {"/bin/sh", "-c",
                   "echo \"$DCP_RANK $DCP_WORLD_SIZE $LOCAL_RANK "
                   "$DCP_RENDEZVOUS\"; echo second; printf no-newline; "
                   "echo to-stderr >&2"});
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 0);
  ASSERT_EQ(c.out.size(), 9u);
  std::string rendezvous;
  for (int r = 0; r < 3; ++r) {
    const std::string prefix = "[rank " + std::to_string(r) + "] ";
    EXPECT_THAT(c.out, Contains(prefix + "second"));
    EXPECT_THAT(c.out, Contains(prefix + "no-newline"));
    EXPECT_THAT(c.err, Contains(prefix + "to-stderr"));
    for (const std::string& line : c.out) {
      const std::string head =
          prefix + std::to_string(r) + " 3 " + std::to_string(r) + " ";
      if (absl::StartsWith(line, head)) rendezvous = line.substr(head.size());
    }
  }
  for (const std::string& line : c.out) {
    EXPECT_TRUE(absl::StartsWith(line, "[rank ")) << line;
  }
  ASSERT_FALSE(rendezvous.empty());
  // The temporary rendezvous directory is gone afterwards.
  EXPECT_FALSE(std::filesystem::exists(rendezvous)) << rendezvous;
}

// What torchrun gives its workers besides the rank variables (a store
// address for env:// on one node, OMP_NUM_THREADS=1), stdin at /dev/null
// (a rank reading the terminal would be stopped for ever), and progress
// lines redrawn with a carriage return passed on as they come.
TEST(LaunchTest, TorchrunVariablesStdinAndCarriageReturns) {
  Captured c =
      RunLauncher("torchrun_like", 2,
                  {"/bin/sh", "-c",
                   "echo \"vars $MASTER_ADDR $MASTER_PORT $OMP_NUM_THREADS\"; "
                   "if read line; then echo read; else echo stdin-eof; fi; "
                   "printf 'a\\rb\\r'"});
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 0);
  std::set<std::string> vars;
  std::string all;
  for (const std::string& line : c.out) {
    all += line + "\n";
    const size_t at = line.find("vars ");
    if (at != std::string::npos) vars.insert(line.substr(at));
  }
  ASSERT_EQ(vars.size(), 1u) << all;  // The same address on every rank.
  std::vector<std::string> words = absl::StrSplit(*vars.begin(), ' ');
  ASSERT_EQ(words.size(), 4u) << *vars.begin();
  EXPECT_EQ(words[1], "127.0.0.1");
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(words[2], &port) && port > 0) << words[2];
  EXPECT_EQ(words[3], "1");
  // (A line ended by "\r" and the next one of another rank share a line of
  // the captured file: look for them in the whole text.)
  for (const char* rank : {"[rank 0] ", "[rank 1] "}) {
    EXPECT_THAT(all, HasSubstr(absl::StrCat(rank, "stdin-eof\n")));
    EXPECT_THAT(all, HasSubstr(absl::StrCat(rank, "a\r")));
    EXPECT_THAT(all, HasSubstr(absl::StrCat(rank, "b\r")));
  }
}

// The clock in these tests only bounds a hang: a rank left running sleeps
// for kHang, far past kHangBound.
constexpr char kHang[] = "600";
constexpr absl::Duration kHangBound = absl::Seconds(120);

TEST(LaunchTest, FirstFailureCodeStopsTheOthers) {
  Captured c = RunLauncher(
      "fail", 3,
      {"/bin/sh", "-c",
       absl::StrCat("echo started; if [ \"$DCP_RANK\" = 1 ]; then ",
                    "echo failing; exit 3; fi; exec sleep ", kHang)});
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 3);
  EXPECT_LT(c.took, kHangBound);
  EXPECT_THAT(c.out, Contains("[rank 1] failing"));
  EXPECT_THAT(c.err,
              Contains(HasSubstr("rank 1 exited with code 3; stopping")));
}

TEST(LaunchTest, RankIgnoringSigtermIsKilledAfterGrace) {
  // Rank 0 fails only once rank 1 ignores SIGTERM (it says so through a
  // FIFO, whose open blocks rank 0 until then); the ignored disposition
  // survives the exec.
  const std::string ready =
      dcp::testing::FreshTestDir("stubborn_fifo") + "/ready";
  ASSERT_EQ(mkfifo(ready.c_str(), 0600), 0) << ready;
  const absl::Duration grace = absl::Milliseconds(500);
  Captured c = RunLauncher(
      "stubborn", 2,
      {"/bin/sh", "-c",
       absl::StrCat("if [ \"$DCP_RANK\" = 0 ]; then read x < ", ready,
                    "; exit 7; fi; trap '' TERM; echo ignoring; echo x > ",
                    ready, "; exec sleep ", kHang)},
      grace);
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 7);
  EXPECT_THAT(c.out, Contains("[rank 1] ignoring"));
  // Killed, not waited for: the launcher sends SIGKILL only after the
  // grace period (a lower bound holds on any machine).
  EXPECT_GE(c.took, grace);
  EXPECT_LT(c.took, kHangBound);
}

TEST(LaunchTest, MissingProgramIs127) {
  Captured c = RunLauncher("missing", 2, {"/nonexistent/program"});
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 127);
  EXPECT_THAT(c.err, Contains(HasSubstr("cannot run /nonexistent/program")));
}

TEST(LaunchTest, ParsesCommandLine) {
  const char* argv[] = {"dcp_launch", "-n",
                        "4",          "--rendezvous",
                        "/tmp/rv",    "--grace-seconds",
                        "0.5",        "--stray-wait-seconds",
                        "2.5",        "--",
                        "prog",       "-x",
                        "--flag"};
  auto options = ParseLaunchArgs(13, argv);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->num_ranks, 4);
  EXPECT_EQ(options->rendezvous, "/tmp/rv");
  EXPECT_EQ(options->grace, absl::Milliseconds(500));
  EXPECT_EQ(options->stray_wait, absl::Milliseconds(2500));
  EXPECT_EQ(options->command,
            (std::vector<std::string>{"prog", "-x", "--flag"}));
  const char* bad[] = {"dcp_launch", "--", "prog"};
  EXPECT_EQ(ParseLaunchArgs(3, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  const char* negative[] = {"dcp_launch", "-n", "2",   "--stray-wait-seconds",
                            "-1",         "--", "prog"};
  const absl::Status refused = ParseLaunchArgs(7, negative).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("--stray-wait-seconds"));
}

// A real Gloo job: three ranks join through the launcher's environment.
TEST(LaunchTest, GlooJobRunsUnderTheLauncher) {
  Captured c = RunLauncher("gloo_job", 3, {"tests/comm/comm_rank_main", "ok"});
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 0) << ::testing::PrintToString(c.err);
  EXPECT_THAT(c.out, Contains("[rank 0] gathered: rank 0,rank 1,rank 2"));
  EXPECT_THAT(c.out, Contains("[rank 2] joined gloo group as rank 2 of 3"));
}

TEST(LaunchTest, LostRankFailsTheJobWithItsCode) {
  Captured c =
      RunLauncher("gloo_lost", 3, {"tests/comm/comm_rank_main", "lose", "1"});
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 3) << ::testing::PrintToString(c.err);
  EXPECT_LT(c.took, absl::Seconds(10));
}

// Runs `nodes` launchers (node 0 .. nodes-1, each in its own process, as on
// separate machines) of `per_node` ranks each; returns each launcher's exit
// code (-1 if Launch itself failed or the node did not exit) and the lines
// all of them printed to stdout.
struct Nodes {
  std::vector<int> codes;
  std::vector<std::string> out;
  std::vector<std::string> err;
};

Nodes RunNodes(const std::string& name, int nodes, int per_node,
               const std::string& rendezvous, const std::string& job_id,
               const std::vector<std::string>& command) {
  const std::string dir = dcp::testing::FreshTestDir(name);
  std::vector<dcp::testing::RankExit> exits = dcp::testing::RunRanks(
      nodes,
      [&](int node) -> int {
        const std::string base = dir + "/node" + std::to_string(node);
        LaunchOptions options;
        options.num_ranks = per_node;
        options.num_nodes = nodes;
        options.node_rank = node;
        options.rendezvous = rendezvous;
        options.job_id = job_id;
        options.command = command;
        options.stdout_fd =
            open((base + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        options.stderr_fd =
            open((base + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        absl::StatusOr<int> code = Launch(options);
        if (!code.ok()) {
          dprintf(options.stderr_fd, "%s\n", code.status().ToString().c_str());
          return 100;
        }
        return *code;
      },
      absl::Seconds(90));
  Nodes result;
  for (int node = 0; node < nodes; ++node) {
    const std::string base = dir + "/node" + std::to_string(node);
    result.codes.push_back(exits[node].exited ? exits[node].exit_code : -1);
    for (std::string& line : ReadLines(base + ".out")) {
      result.out.push_back(std::move(line));
    }
    for (std::string& line : ReadLines(base + ".err")) {
      result.err.push_back(std::move(line));
    }
  }
  return result;
}

TEST(LaunchTest, NodesGetGlobalRanks) {
  const std::string rendezvous = dcp::testing::FreshTestDir("global_rv");
  Nodes n = RunNodes(
      "global", 2, 2, rendezvous, "global-ranks",
      {"/bin/sh", "-c",
       "echo \"$DCP_RANK $RANK $DCP_WORLD_SIZE $WORLD_SIZE $LOCAL_RANK "
       "$LOCAL_WORLD_SIZE $GROUP_RANK $DCP_JOB_ID $DCP_RENDEZVOUS\""});
  EXPECT_EQ(n.codes, (std::vector<int>{0, 0}))
      << ::testing::PrintToString(n.err);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(n.out, Contains(absl::StrFormat(
                           "[rank %d] %d %d 4 4 %d 2 %d global-ranks %s", rank,
                           rank, rank, rank % 2, rank / 2, rendezvous)));
  }
}

TEST(LaunchTest, MultiNodeFlagsAreChecked) {
  LaunchOptions options;
  options.num_ranks = 2;
  options.num_nodes = 2;
  options.command = {"/bin/true"};
  EXPECT_THAT(std::string(Launch(options).status().message()),
              HasSubstr("--nnodes 2 needs --rendezvous"));
  options.rendezvous = "/tmp/unused";
  options.node_rank = 2;
  EXPECT_THAT(std::string(Launch(options).status().message()),
              HasSubstr("--node-rank 2 is outside [0, --nnodes 2)"));
  const char* argv[] = {"dcp",
                        "--nnodes",
                        "2",
                        "--node-rank",
                        "1",
                        "--nproc-per-node",
                        "4",
                        "--rendezvous",
                        "redis://h:7000",
                        "--job-id",
                        "j",
                        "--",
                        "prog"};
  auto parsed = ParseLaunchArgs(13, argv);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_nodes, 2);
  EXPECT_EQ(parsed->node_rank, 1);
  EXPECT_EQ(parsed->num_ranks, 4);
  EXPECT_EQ(parsed->rendezvous, "redis://h:7000");
  EXPECT_EQ(parsed->job_id, "j");
}

// Two launchers as node 0 and node 1 of a 2 x 2 job save a checkpoint;
// then two launchers load it (every element checked), meeting in the same
// rendezvous directory under another job id, and 4 x 1 loads it again with
// no job id at all.
TEST(LaunchTest, TwoNodesSaveAndLoadThroughADirectory) {
  const std::string rendezvous = dcp::testing::FreshTestDir("nodes_rv");
  const std::string checkpoint = dcp::testing::FreshTestDir("nodes_ckpt");
  const std::string rank_main = "tests/comm/save_rank_main";
  Nodes save = RunNodes("nodes_save", 2, 2, rendezvous, "save-job",
                        {rank_main, "save", checkpoint});
  ASSERT_EQ(save.codes, (std::vector<int>{0, 0}))
      << ::testing::PrintToString(save.err);
  EXPECT_THAT(save.out, Contains("[rank 3] saved as rank 3 of 4"));
  Nodes load = RunNodes("nodes_load", 2, 2, rendezvous, "load-job",
                        {rank_main, "load", checkpoint});
  EXPECT_EQ(load.codes, (std::vector<int>{0, 0}))
      << ::testing::PrintToString(load.err);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(load.out,
                Contains(absl::StrFormat("[rank %d] loaded ok as rank %d of 4",
                                         rank, rank)));
  }
  Nodes again = RunNodes("nodes_again", 4, 1, rendezvous, "",
                         {rank_main, "load", checkpoint});
  EXPECT_EQ(again.codes, (std::vector<int>{0, 0, 0, 0}))
      << ::testing::PrintToString(again.err);
}

// The same over redis: 2 x 2 save, then 3 x 1 load.
TEST(LaunchTest, NodesSaveAndLoadThroughRedis) {
  std::string why_not;
  bool broken = false;
  auto redis = dcp::testing::RedisServer::StartIfInstalled(&why_not, &broken);
  ASSERT_FALSE(broken) << why_not;
  if (redis == nullptr) GTEST_SKIP() << why_not;
  const std::string checkpoint = dcp::testing::FreshTestDir("redis_ckpt");
  const std::string rank_main = "tests/comm/save_rank_main";
  Nodes save = RunNodes("redis_save", 2, 2, redis->address(), "",
                        {rank_main, "save", checkpoint});
  ASSERT_EQ(save.codes, (std::vector<int>{0, 0}))
      << ::testing::PrintToString(save.err);
  Nodes load = RunNodes("redis_load", 3, 1, redis->address(), "",
                        {rank_main, "load", checkpoint});
  EXPECT_EQ(load.codes, (std::vector<int>{0, 0, 0}))
      << ::testing::PrintToString(load.err);
  EXPECT_THAT(load.out, Contains("[rank 2] loaded ok as rank 2 of 3"));
}

// A rank of node 1 fails: node 1's launcher exits with its code, and node
// 0's ranks fail naming it, so node 0's launcher exits non-zero too.
TEST(LaunchTest, LostRankOnOneNodeFailsBothNodes) {
  const std::string rendezvous = dcp::testing::FreshTestDir("lost_rv");
  Nodes n = RunNodes("nodes_lost", 2, 2, rendezvous, "lost-job",
                     {"tests/comm/comm_rank_main", "lose", "3"});
  EXPECT_EQ(n.codes[1], 3) << ::testing::PrintToString(n.err);
  EXPECT_NE(n.codes[0], 0) << ::testing::PrintToString(n.err);
}

}  // namespace
}  // namespace dcp::tools
