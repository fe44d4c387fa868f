// Consecutive jobs against one rendezvous (issue 26): a 3-rank save, then a
// 2-rank load, each rank a real process (save_rank_main) reading its
// rendezvous from the environment with no job id, so both jobs use the
// same key prefix. Before keys were removed once a group formed, the load
// failed with "Key ... already set" (redis) or kAlreadyExists (directory).
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"

namespace dcp::testing {
namespace {

constexpr char kRankMain[] = "tests/comm/save_rank_main";

// Runs `n` ranks of save_rank_main MODE CHECKPOINT meeting at `rendezvous`;
// every rank must exit 0.
void RunJob(int n, const std::string& mode, const std::string& checkpoint,
            const std::string& rendezvous) {
  std::vector<RankExit> exits = RunRanks(
      n,
      [&](int rank) -> int {
        for (const char* name :
             {"DCP_JOB_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
              "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid", "RANK",
              "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"}) {
          unsetenv(name);
        }
        setenv("DCP_RANK", std::to_string(rank).c_str(), 1);
        setenv("DCP_WORLD_SIZE", std::to_string(n).c_str(), 1);
        setenv("DCP_RENDEZVOUS", rendezvous.c_str(), 1);
        execl(kRankMain, kRankMain, mode.c_str(), checkpoint.c_str(),
              static_cast<char*>(nullptr));
        std::perror("execl save_rank_main");
        return 127;
      },
      absl::Seconds(60));
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_TRUE(exits[r].exited && exits[r].exit_code == 0)
        << mode << " with " << n << " ranks: rank " << r << " exited "
        << exits[r].exit_code << " signal " << exits[r].signal
        << (exits[r].timed_out ? " (timed out)" : "");
  }
}

TEST(RendezvousReuseTest, ConsecutiveJobsShareADirectory) {
  const std::string rendezvous = FreshTestDir("reuse-rendezvous");
  const std::string checkpoint = FreshTestDir("reuse-dir-checkpoint");
  RunJob(3, "save", checkpoint, rendezvous);
  RunJob(2, "load", checkpoint, rendezvous);
  RunJob(2, "save", checkpoint + "-2", rendezvous);
  RunJob(3, "load", checkpoint + "-2", rendezvous);
}

TEST(RendezvousReuseTest, ConsecutiveJobsShareARedisServer) {
  std::string why_not;
  bool broken = false;
  std::unique_ptr<RedisServer> redis =
      RedisServer::StartIfInstalled(&why_not, &broken);
  ASSERT_FALSE(broken) << why_not;
  if (redis == nullptr) GTEST_SKIP() << why_not;
  const std::string checkpoint = FreshTestDir("reuse-redis-checkpoint");
  RunJob(3, "save", checkpoint, redis->address());
  RunJob(2, "load", checkpoint, redis->address());
  RunJob(2, "save", checkpoint + "-2", redis->address());
  RunJob(3, "load", checkpoint + "-2", redis->address());
}

}  // namespace
}  // namespace dcp::testing
