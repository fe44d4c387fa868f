// What a machine without a GPU can check of the NCCL backend: the library
// loads lazily, unique ids are made, the id travels through the store, and
// a missing GPU or a missing rank 0 is a clear error, not a hang or crash.
// With a GPU, a one-rank group moves payloads through device buffers.
#include "comm/nccl_process_group.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "comm/internal/nccl_library.h"
#include "cuda_runtime_api.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::comm {
namespace {

using ::testing::HasSubstr;

bool HasGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::string TestDir(const char* name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

TEST(NcclLibraryTest, LoadsAndMakesDistinctUniqueIds) {
  auto lib = internal::LoadNccl();
  if (!lib.ok()) GTEST_SKIP() << lib.status();
  EXPECT_GT((*lib)->version, 0);
  auto a = internal::NewNcclUniqueId();
  auto b = internal::NewNcclUniqueId();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->size(), 128u);
  EXPECT_NE(*a, *b);
}

TEST(NcclProcessGroupTest, OneRankWithoutGpuIsFailedPreconditionElseWorks) {
  if (!internal::LoadNccl().ok()) GTEST_SKIP() << "no NCCL here";
  NcclOptions options;
  options.timeout = absl::Seconds(20);
  options.connect_timeout = absl::Seconds(20);
  auto group = NcclProcessGroup::Create(options);
  if (!HasGpu()) {
    EXPECT_EQ(group.status().code(), absl::StatusCode::kFailedPrecondition)
        << group.status();
    EXPECT_THAT(group.status().message(), HasSubstr("GPU"));
    EXPECT_THAT(group.status().message(), HasSubstr("gloo"));
    return;
  }
  ASSERT_TRUE(group.ok()) << group.status();
  ProcessGroup& pg = **group;
  const std::string payload("device\0bytes", 12);
  auto all = pg.AllGather(payload);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, std::vector<std::string>{payload});
  auto gathered = pg.Gather(payload, 0);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_EQ(*gathered, std::vector<std::string>{payload});
  auto scattered = pg.Scatter(std::vector<std::string>{payload}, 0);
  ASSERT_TRUE(scattered.ok()) << scattered.status();
  EXPECT_EQ(*scattered, payload);
  auto broadcast = pg.Broadcast(payload, 0);
  ASSERT_TRUE(broadcast.ok()) << broadcast.status();
  EXPECT_EQ(*broadcast, payload);
  EXPECT_TRUE(pg.Barrier().ok());
}

TEST(NcclProcessGroupTest, MissingRankZeroTimesOutNamingIt) {
  if (!internal::LoadNccl().ok()) GTEST_SKIP() << "no NCCL here";
  NcclOptions options;
  options.rank = 1;
  options.world_size = 2;
  options.store.path = TestDir("nccl_missing_rank0");
  options.connect_timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  auto group = NcclProcessGroup::Create(options);
  // Bounded by the connect timeout, not the group's (minutes); the slack
  // is for sanitizer builds on a loaded machine.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded)
      << group.status();
  EXPECT_THAT(group.status().message(), HasSubstr("rank 0"));
}

TEST(NcclProcessGroupTest, BadRankIsInvalidArgument) {
  NcclOptions options;
  options.rank = 2;
  options.world_size = 2;
  EXPECT_EQ(NcclProcessGroup::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::comm
