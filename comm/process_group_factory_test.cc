#include "comm/process_group_factory.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::comm {
namespace {

using ::testing::HasSubstr;

TEST(ParseBackendTest, NamesRoundTrip) {
  for (Backend b :
       {Backend::kAuto, Backend::kLocal, Backend::kGloo, Backend::kNccl}) {
    auto parsed = ParseBackend(BackendName(b));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, b);
  }
  EXPECT_EQ(*ParseBackend("GLOO"), Backend::kGloo);
  EXPECT_THAT(ParseBackend("mpi").status().message(), HasSubstr("\"mpi\""));
}

TEST(CreateProcessGroupTest, SingleRankEnvironmentGivesLocalGroup) {
  auto group = CreateProcessGroupFromEnvironment({}, MapEnvironment({}));
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->backend(), "local");
  EXPECT_EQ((*group)->size(), 1);
}

TEST(CreateProcessGroupTest, GlooWorldOfOneNeedsNoStore) {
  auto group = CreateProcessGroupFromEnvironment(
      {}, MapEnvironment({{"DCP_COMM_BACKEND", "gloo"}}));
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->backend(), "gloo");
  auto all = (*group)->AllGather("x");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, std::vector<std::string>{"x"});
}

TEST(CreateProcessGroupTest, LocalBackendRefusesManyRanks) {
  auto group = CreateProcessGroupFromEnvironment(
      {}, MapEnvironment({{"DCP_COMM_BACKEND", "local"},
                          {"DCP_RANK", "0"},
                          {"DCP_WORLD_SIZE", "2"},
                          {"DCP_RENDEZVOUS", "/tmp/unused"}}));
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(group.status().message(), HasSubstr("DCP_RANK/DCP_WORLD_SIZE"));
}

TEST(CreateProcessGroupTest, BadBackendVariableIsNamed) {
  auto group = CreateProcessGroupFromEnvironment(
      {}, MapEnvironment({{"DCP_COMM_BACKEND", "tcp"}}));
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(group.status().message(), HasSubstr("DCP_COMM_BACKEND"));
}

}  // namespace
}  // namespace dcp::comm
