#include "comm/process_group.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(LocalProcessGroupTest, EveryCollectiveReturnsOwnPayload) {
  LocalProcessGroup group;
  EXPECT_EQ(group.rank(), 0);
  EXPECT_EQ(group.size(), 1);
  EXPECT_EQ(group.backend(), "local");

  const std::string payload("plan\0bytes", 10);
  auto gathered = group.Gather(payload, /*root=*/0);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_THAT(*gathered, ElementsAre(payload));

  auto scattered = group.Scatter(std::vector<std::string>{payload}, 0);
  ASSERT_TRUE(scattered.ok()) << scattered.status();
  EXPECT_EQ(*scattered, payload);

  auto broadcast = group.Broadcast(payload, 0);
  ASSERT_TRUE(broadcast.ok()) << broadcast.status();
  EXPECT_EQ(*broadcast, payload);

  auto all = group.AllGather(payload);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre(payload));

  EXPECT_TRUE(group.Barrier().ok());
}

TEST(LocalProcessGroupTest, BadRootIsInvalidArgumentAndDoesNotBreakGroup) {
  LocalProcessGroup group;
  auto gathered = group.Gather("x", /*root=*/1);
  EXPECT_EQ(gathered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gathered.status().message(), HasSubstr("root 1"));
  EXPECT_EQ(group.Broadcast("x", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(group.Barrier().ok());
}

TEST(LocalProcessGroupTest, ScatterNeedsOnePayloadPerRank) {
  LocalProcessGroup group;
  auto scattered = group.Scatter(std::vector<std::string>{"a", "b"}, 0);
  EXPECT_EQ(scattered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(scattered.status().message(), HasSubstr("2 payloads"));
}

TEST(StatusCodecTest, RoundTripsCodeAndMessage) {
  for (const absl::Status& status :
       {absl::OkStatus(), absl::UnavailableError("rank 2 lost"),
        absl::DataLossError(std::string("bin\0ary", 7))}) {
    absl::Status decoded = absl::UnknownError("unset");
    ASSERT_TRUE(DecodeStatus(EncodeStatus(status), &decoded).ok());
    EXPECT_EQ(decoded, status);
  }
}

TEST(StatusCodecTest, RejectsGarbage) {
  absl::Status decoded;
  EXPECT_EQ(DecodeStatus("ab", &decoded).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeStatus(std::string("\xff\0\0\0", 4), &decoded).code(),
            absl::StatusCode::kDataLoss);
}

TEST(AllGatherStatusesTest, LocalGroupReturnsOwnStatus) {
  LocalProcessGroup group;
  auto statuses =
      AllGatherStatuses(group, absl::ResourceExhaustedError("disk full"));
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  EXPECT_THAT(*statuses,
              ElementsAre(absl::ResourceExhaustedError("disk full")));
}

}  // namespace
}  // namespace dcp::comm
