#include "comm/rendezvous.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::comm {
namespace {

using ::testing::HasSubstr;

TEST(RendezvousTest, NoVariablesIsSingleRank) {
  auto info = RendezvousFromEnvironment(MapEnvironment({}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 0);
  EXPECT_EQ(info->world_size, 1);
  EXPECT_EQ(info->local_rank, -1);
  EXPECT_FALSE(info->store.has_value());
  EXPECT_EQ(info->listen_address, "127.0.0.1");
}

TEST(RendezvousTest, DcpVariablesWinOverTorchrun) {
  auto info = RendezvousFromEnvironment(
      MapEnvironment({{"DCP_RANK", "2"},
                      {"DCP_WORLD_SIZE", "4"},
                      {"RANK", "0"},
                      {"WORLD_SIZE", "8"},
                      {"LOCAL_RANK", "2"},
                      {"DCP_RENDEZVOUS", "/tmp/rv"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 2);
  EXPECT_EQ(info->world_size, 4);
  EXPECT_EQ(info->local_rank, 2);
  EXPECT_EQ(info->rank_source, "DCP_RANK/DCP_WORLD_SIZE");
  ASSERT_TRUE(info->store.has_value());
  EXPECT_EQ(info->store->kind, StoreAddress::Kind::kFile);
  EXPECT_EQ(info->store->path, "/tmp/rv");
}

TEST(RendezvousTest, ReadsTorchrunSlurmAndOpenMpi) {
  struct Case {
    std::map<std::string, std::string> vars;
    int rank, size, local;
  };
  const Case cases[] = {
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}}, 1, 2, 1},
      {{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}},
       5,
       8,
       1},
      {{{"OMPI_COMM_WORLD_RANK", "3"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}},
       3,
       4,
       3},
  };
  for (Case c : cases) {
    c.vars["DCP_RENDEZVOUS"] = "redis://head-node:7000";
    auto info = RendezvousFromEnvironment(MapEnvironment(c.vars));
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->rank, c.rank);
    EXPECT_EQ(info->world_size, c.size);
    EXPECT_EQ(info->local_rank, c.local);
    ASSERT_TRUE(info->store.has_value());
    EXPECT_EQ(info->store->kind, StoreAddress::Kind::kRedis);
    EXPECT_EQ(info->store->host, "head-node");
    EXPECT_EQ(info->store->port, 7000);
  }
}

TEST(RendezvousTest, ErrorsNameWhatIsMissing) {
  auto half = RendezvousFromEnvironment(MapEnvironment({{"RANK", "1"}}));
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(half.status().message(), HasSubstr("WORLD_SIZE is not"));

  auto no_store = RendezvousFromEnvironment(
      MapEnvironment({{"DCP_RANK", "0"}, {"DCP_WORLD_SIZE", "2"}}));
  EXPECT_EQ(no_store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_store.status().message(), HasSubstr("DCP_RENDEZVOUS"));

  auto bad_int = RendezvousFromEnvironment(
      MapEnvironment({{"DCP_RANK", "one"}, {"DCP_WORLD_SIZE", "2"}}));
  EXPECT_THAT(bad_int.status().message(), HasSubstr("DCP_RANK=\"one\""));

  auto out_of_range = RendezvousFromEnvironment(MapEnvironment(
      {{"DCP_RANK", "4"}, {"DCP_WORLD_SIZE", "4"}, {"DCP_RENDEZVOUS", "/d"}}));
  EXPECT_THAT(out_of_range.status().message(), HasSubstr("outside [0"));
}

TEST(RendezvousTest, SingleRankNeedsNoStore) {
  auto info = RendezvousFromEnvironment(
      MapEnvironment({{"DCP_RANK", "0"}, {"DCP_WORLD_SIZE", "1"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->store.has_value());
}

TEST(StoreAddressTest, Parses) {
  auto redis = ParseStoreAddress("redis://10.0.0.1");
  ASSERT_TRUE(redis.ok());
  EXPECT_EQ(redis->host, "10.0.0.1");
  EXPECT_EQ(redis->port, 6379);
  EXPECT_EQ(redis->ToString(), "redis://10.0.0.1:6379");
  EXPECT_FALSE(ParseStoreAddress("redis://host:99999").ok());
  EXPECT_FALSE(ParseStoreAddress("redis://:80").ok());
  EXPECT_FALSE(ParseStoreAddress("tcp://host:80").ok());
  EXPECT_FALSE(ParseStoreAddress("").ok());
}

TEST(JobIdTest, FirstSourceWins) {
  EXPECT_EQ(JobIdFromEnvironment(MapEnvironment({})), "");
  EXPECT_EQ(JobIdFromEnvironment(MapEnvironment(
                {{"DCP_JOB_ID", "mine"}, {"SLURM_JOB_ID", "17"}})),
            "mine");
  EXPECT_EQ(
      JobIdFromEnvironment(MapEnvironment({{"SLURM_JOB_ID", "17"},
                                           {"SLURM_STEP_ID", "2"},
                                           {"TORCHELASTIC_RUN_ID", "r"}})),
      "slurm-17.2");
  EXPECT_EQ(
      JobIdFromEnvironment(MapEnvironment({{"TORCHELASTIC_RUN_ID", "r"}})),
      "torch-r");
  // torchrun without --rdzv-id says "none" for every job: two of them
  // beside each other differ by their store's address.
  for (const char* port : {"29621", "29622"}) {
    EXPECT_EQ(
        JobIdFromEnvironment(MapEnvironment({{"TORCHELASTIC_RUN_ID", "none"},
                                             {"MASTER_ADDR", "127.0.0.1"},
                                             {"MASTER_PORT", port}})),
        absl::StrCat("torch-127.0.0.1:", port));
  }
  EXPECT_EQ(JobIdFromEnvironment(MapEnvironment(
                {{"TORCHELASTIC_RUN_ID", "r"}, {"MASTER_PORT", "29621"}})),
            "torch-r");
  EXPECT_EQ(JobIdFromEnvironment(
                MapEnvironment({{"OMPI_MCA_ess_base_jobid", "3456"}})),
            "ompi-3456");
  auto info = RendezvousFromEnvironment(MapEnvironment(
      {{"DCP_RANK", "0"}, {"DCP_WORLD_SIZE", "1"}, {"DCP_JOB_ID", "j1"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->job_id, "j1");
}

TEST(RendezvousTest, InterfaceFromEnvironment) {
  auto info = RendezvousFromEnvironment(
      MapEnvironment({{"GLOO_SOCKET_IFNAME", "eth1"}}));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->listen_interface, "eth1");
  info = RendezvousFromEnvironment(MapEnvironment(
      {{"DCP_SOCKET_IFNAME", "ib0"}, {"GLOO_SOCKET_IFNAME", "eth1"}}));
  EXPECT_EQ(info->listen_interface, "ib0");
  // An explicit address wins.
  info = RendezvousFromEnvironment(MapEnvironment(
      {{"DCP_COMM_ADDR", "10.0.0.2"}, {"DCP_SOCKET_IFNAME", "ib0"}}));
  EXPECT_EQ(info->listen_address, "10.0.0.2");
  EXPECT_EQ(info->listen_interface, "");
}

}  // namespace
}  // namespace dcp::comm
