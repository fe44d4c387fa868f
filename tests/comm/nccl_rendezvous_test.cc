// Two forked ranks form an NcclProcessGroup through a FileStore. Without a
// GPU, rank 1 reaching the GPU check (kFailedPrecondition) rather than
// timing out proves rank 0's unique id travelled through the store. With
// two GPUs or more, payloads of different sizes go through device buffers
// and are checked byte for byte.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/nccl_process_group.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"

namespace dcp::comm {
namespace {

using ::dcp::testing::Check;

constexpr int kRanOk = 0;
constexpr int kNoGpu = 10;
constexpr int kTimedOut = 11;

std::string Payload(int rank, size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>(rank * 37 + i);
  return out;
}

int RunRank(const std::string& dir, int rank) {
  NcclOptions options;
  options.rank = rank;
  options.world_size = 2;
  options.store.path = dir;
  options.cuda_device = rank;
  options.timeout = absl::Seconds(10);
  options.connect_timeout = absl::Seconds(5);
  auto group = NcclProcessGroup::Create(options);
  if (group.status().code() == absl::StatusCode::kFailedPrecondition) {
    return kNoGpu;
  }
  if (group.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return kTimedOut;
  }
  if (!group.ok()) return Check(false, rank, group.status().ToString());
  ProcessGroup& pg = **group;
  const size_t sizes[] = {3, 70001};
  auto all = pg.AllGather(Payload(rank, sizes[rank]));
  if (!all.ok()) return Check(false, rank, all.status().ToString());
  for (int r = 0; r < 2; ++r) {
    if (int rc = Check((*all)[r] == Payload(r, sizes[r]), rank,
                       absl::StrCat("allgather from rank ", r)))
      return rc;
  }
  auto gathered = pg.Gather(Payload(rank, sizes[1 - rank]), 1);
  if (!gathered.ok()) return Check(false, rank, gathered.status().ToString());
  if (rank == 1 && (*gathered)[0] != Payload(0, sizes[1])) {
    return Check(false, rank, "gather payload of rank 0");
  }
  std::vector<std::string> parts;
  if (rank == 0) parts = {Payload(0, 5), Payload(1, 0)};
  auto mine = pg.Scatter(parts, 0);
  if (!mine.ok()) return Check(false, rank, mine.status().ToString());
  if (int rc = Check(*mine == Payload(rank, rank == 0 ? 5 : 0), rank,
                     "scatter payload"))
    return rc;
  auto b = pg.Broadcast(rank == 1 ? Payload(9, 4096) : "", 1);
  if (!b.ok()) return Check(false, rank, b.status().ToString());
  if (int rc = Check(*b == Payload(9, 4096), rank, "broadcast payload"))
    return rc;
  absl::Status s = pg.Barrier();
  return Check(s.ok(), rank, s.ToString());
}

TEST(NcclRendezvousTest, UniqueIdTravelsThroughTheStore) {
  const std::string dir = dcp::testing::FreshTestDir("nccl_two_ranks");
  std::vector<dcp::testing::RankExit> exits = dcp::testing::RunRanks(
      2, [&](int rank) { return RunRank(dir, rank); }, absl::Seconds(60));
  for (const auto& e : exits) ASSERT_TRUE(e.exited) << "signal " << e.signal;
  if (exits[0].exit_code == kRanOk && exits[1].exit_code == kRanOk) return;
  // No GPU, or one GPU for two ranks: rank 1 got the id and stopped at the
  // device check; rank 0 stopped there too or waited for rank 1 in vain.
  EXPECT_EQ(exits[1].exit_code, kNoGpu);
  EXPECT_TRUE(exits[0].exit_code == kNoGpu || exits[0].exit_code == kTimedOut)
      << exits[0].exit_code;
}

}  // namespace
}  // namespace dcp::comm
