// A peer that announces an absurd payload size: rank 0 is a real
// GlooProcessGroup; "rank 1" is this test speaking the group's wire
// protocol by hand (gloo_process_group.cc: a 24-byte header {op[12], root,
// size} on slot kSlotBase + 2 * call, the bytes on the next slot). Rank 1
// announces a broadcast payload larger than rank 0 accepts and never sends
// it; rank 0 must fail with kDataLoss naming the op, both ranks and the
// size, before allocating it (an allocation of twice this machine's
// memory would fail or get the test killed).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "comm/gloo_process_group.h"
#include "comm/internal/gloo_store.h"
#include "comm/internal/payload_limit.h"
#include "comm/store_process_group.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"

namespace dcp::comm {
namespace {

using ::dcp::testing::FreshTestDir;

// The layout GlooProcessGroup puts before every payload.
struct Header {
  char op[12] = {};
  int32_t root = -1;
  uint64_t size = 0;
};
static_assert(sizeof(Header) == 24);
constexpr uint64_t kSlotBase = uint64_t{1} << 40;

// Rank 1 of `options`' group, by hand: joins, forms the mesh, passes the
// "joined" exchange (announcing no probe address), then announces a
// broadcast from itself of `announced` bytes and sends none of them.
void FakeRankOne(const GlooOptions& options, uint64_t announced,
                 absl::Notification& rank0_done) {
  auto store = internal::OpenStore(options.store);
  ASSERT_TRUE(store.ok()) << store.status();
  std::unique_ptr<KeyValueStore> keys = internal::AsKeyValueStore(**store);
  const std::string base = absl::StrCat(options.group_name, "/0");
  auto generation =
      JoinGeneration(*keys, base, 1, 2, absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(generation.ok()) << generation.status();
  gloo::rendezvous::PrefixStore prefixed(absl::StrCat(base, "/", *generation),
                                         **store);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(1, 2);
  context->setTimeout(std::chrono::seconds(60));
  context->connectFullMesh(prefixed, device);

  // Call 0, "joined": one header each way; rank 0's probe address follows.
  Header mine;
  std::strcpy(mine.op, "joined");
  Header theirs;
  auto send = context->createUnboundBuffer(&mine, sizeof(mine));
  auto recv = context->createUnboundBuffer(&theirs, sizeof(theirs));
  send->send(0, kSlotBase);
  recv->recv(0, kSlotBase);
  recv->waitRecv();
  std::string probe(theirs.size, '\0');
  if (!probe.empty()) {
    auto data = context->createUnboundBuffer(probe.data(), probe.size());
    data->recv(0, kSlotBase + 1);
    data->waitRecv();
  }
  send->waitSend();

  // Call 1: a broadcast from rank 1 announcing `announced` bytes.
  Header lie;
  std::strcpy(lie.op, "broadcast");
  lie.root = 1;
  lie.size = announced;
  auto lie_buffer = context->createUnboundBuffer(&lie, sizeof(lie));
  lie_buffer->send(0, kSlotBase + 2);
  lie_buffer->waitSend();
  // Keeps the connection open until rank 0 has judged the header.
  rank0_done.WaitForNotification();
}

absl::Status BroadcastFromALiar(const std::string& name,
                                uint64_t max_payload_bytes,
                                uint64_t announced) {
  GlooOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.store.path = FreshTestDir(name);
  options.group_name = name;
  options.connect_timeout = absl::Seconds(60);
  options.timeout = absl::Seconds(60);
  options.max_payload_bytes = max_payload_bytes;
  absl::Notification rank0_done;
  std::thread fake([&] { FakeRankOne(options, announced, rank0_done); });
  absl::Status status;
  auto group = GlooProcessGroup::Create(options);
  if (!group.ok()) {
    status = group.status();
  } else {
    status = (*group)->Broadcast("", /*root=*/1).status();
  }
  rank0_done.Notify();
  fake.join();
  return status;
}

TEST(GlooOversizedPayloadTest, MoreThanPhysicalMemoryIsDataLoss) {
  const uint64_t memory = internal::PhysicalMemoryBytes();
  ASSERT_LT(memory, uint64_t{1} << 62);
  const uint64_t announced = 2 * memory;
  const absl::Status s = BroadcastFromALiar("liar", 0, announced);
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(
      s.message(), absl::StrCat("broadcast on rank 0 of 2: rank 1 announced "
                                "a payload of ",
                                announced, " bytes, more than the ", memory)))
      << s;
}

TEST(GlooOversizedPayloadTest, TheBoundIsAnOptionOfTheGroup) {
  const absl::Status s = BroadcastFromALiar("small-bound", 4096, 4097);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(
      s.message(),
      "rank 1 announced a payload of 4097 bytes, more than the "
      "4096 this rank accepts"))
      << s;
}

}  // namespace
}  // namespace dcp::comm
