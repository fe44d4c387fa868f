// Tests of the local launcher (tools/launch.h): environment, output
// prefixes, failure propagation, stopping the other ranks, and a real
// Gloo job started through it.
#include "tools/launch.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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

TEST(LaunchTest, FirstFailureCodeStopsTheOthers) {
  Captured c =
      RunLauncher("fail", 3,
                  {"/bin/sh", "-c",
                   "echo started; if [ \"$DCP_RANK\" = 1 ]; then sleep 0.2; "
                   "echo failing; exit 3; fi; sleep 30"});
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 3);
  EXPECT_LT(c.took, absl::Seconds(10));
  EXPECT_THAT(c.out, Contains("[rank 1] failing"));
  EXPECT_THAT(c.err,
              Contains(HasSubstr("rank 1 exited with code 3; stopping")));
}

TEST(LaunchTest, RankIgnoringSigtermIsKilledAfterGrace) {
  Captured c =
      RunLauncher("stubborn", 2,
                  {"/bin/sh", "-c",
                   "if [ \"$DCP_RANK\" = 0 ]; then sleep 0.2; exit 7; fi; "
                   "trap '' TERM; while true; do sleep 0.1; done"},
                  /*grace=*/absl::Milliseconds(500));
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 7);
  EXPECT_LT(c.took, absl::Seconds(5));
}

TEST(LaunchTest, MissingProgramIs127) {
  Captured c = RunLauncher("missing", 2, {"/nonexistent/program"});
  ASSERT_TRUE(c.code.ok()) << c.code.status();
  EXPECT_EQ(*c.code, 127);
  EXPECT_THAT(c.err, Contains(HasSubstr("cannot run /nonexistent/program")));
}

TEST(LaunchTest, ParsesCommandLine) {
  const char* argv[] = {
      "dcp_launch", "-n", "4",    "--rendezvous", "/tmp/rv", "--grace-seconds",
      "0.5",        "--", "prog", "-x",           "--flag"};
  auto options = ParseLaunchArgs(11, argv);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->num_ranks, 4);
  EXPECT_EQ(options->rendezvous, "/tmp/rv");
  EXPECT_EQ(options->grace, absl::Milliseconds(500));
  EXPECT_EQ(options->command,
            (std::vector<std::string>{"prog", "-x", "--flag"}));
  const char* bad[] = {"dcp_launch", "--", "prog"};
  EXPECT_EQ(ParseLaunchArgs(3, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
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

}  // namespace
}  // namespace dcp::tools
