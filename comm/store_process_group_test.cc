// StoreProcessGroup with every rank on a thread of this process, meeting in
// an InMemoryKeyValueStore. Deadlines here only bound a hang, except where
// a test times a rank out on purpose against a rank that never calls.
#include "comm/store_process_group.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::comm {
namespace {

using ::testing::Contains;
using ::testing::ContainsRegex;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr absl::Duration kHang = absl::Seconds(20);
constexpr size_t kMiB = size_t{1} << 20;

// Runs body(rank) on `n` threads and waits for all of them.
void OnThreads(int n, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

// Creates the `n` ranks of group `name` on `store`, one thread each.
std::vector<std::unique_ptr<ProcessGroup>> CreateGroups(
    std::shared_ptr<KeyValueStore> store, const std::string& name, int n,
    absl::Duration timeout = kHang) {
  std::vector<std::unique_ptr<ProcessGroup>> groups(n);
  OnThreads(n, [&](int rank) {
    absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
        CreateStoreProcessGroup(store, rank, n, {name, timeout});
    ASSERT_TRUE(group.ok()) << group.status();
    groups[rank] = *std::move(group);
  });
  return groups;
}

bool AllCreated(const std::vector<std::unique_ptr<ProcessGroup>>& groups) {
  return std::all_of(groups.begin(), groups.end(),
                     [](const auto& group) { return group != nullptr; });
}

// Bytes that differ by rank, call and position, zeros included.
std::string Payload(int rank, int call, size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    out[i] = static_cast<char>((rank * 131 + call * 17 + i * 7) & 0xff);
  }
  return out;
}

// An InMemoryKeyValueStore with scripted misbehaviour.
class ScriptedStore final : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, absl::string_view value) override {
    if (!fail_sets_containing.empty() &&
        absl::StrContains(key, fail_sets_containing)) {
      return absl::InvalidArgumentError("value refused by the test");
    }
    return inner.Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    return inner.Get(key, timeout);
  }
  absl::Status Remove(const std::string& key) override {
    if (remove_unimplemented) {
      return absl::UnimplementedError("this store keeps every key");
    }
    return inner.Remove(key);
  }

  InMemoryKeyValueStore inner;
  bool remove_unimplemented = false;
  std::string fail_sets_containing;  // Set fails for keys containing it.
};

// Runs every collective once per root on each rank of `groups` with
// payloads of `size` bytes and checks every byte on every rank.
void RunEveryCollective(std::vector<std::unique_ptr<ProcessGroup>>& groups,
                        size_t size, int round) {
  const int n = static_cast<int>(groups.size());
  OnThreads(n, [&](int rank) {
    ProcessGroup& group = *groups[rank];
    for (int root = 0; root < n; ++root) {
      const int call = round * 100 + root * 10;
      auto gathered = group.Gather(Payload(rank, call, size), root);
      ASSERT_TRUE(gathered.ok()) << gathered.status();
      if (rank == root) {
        ASSERT_THAT(*gathered, SizeIs(n));
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ((*gathered)[r], Payload(r, call, size)) << "from " << r;
        }
      } else {
        EXPECT_THAT(*gathered, IsEmpty());
      }

      std::vector<std::string> parts;
      if (rank == root) {
        for (int r = 0; r < n; ++r) parts.push_back(Payload(r, call + 1, size));
      }
      auto scattered = group.Scatter(parts, root);
      ASSERT_TRUE(scattered.ok()) << scattered.status();
      EXPECT_EQ(*scattered, Payload(rank, call + 1, size));

      auto broadcast = group.Broadcast(
          rank == root ? Payload(root, call + 2, size) : "ignored", root);
      ASSERT_TRUE(broadcast.ok()) << broadcast.status();
      EXPECT_EQ(*broadcast, Payload(root, call + 2, size));
    }
    auto all = group.AllGather(Payload(rank, round, size));
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_THAT(*all, SizeIs(n));
    for (int r = 0; r < n; ++r) EXPECT_EQ((*all)[r], Payload(r, round, size));
    EXPECT_TRUE(group.Barrier().ok());
  });
}

class EveryCollectiveTest
    : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(EveryCollectiveTest, DeliversEveryByteAndLeavesOnlyTheLastBarrier) {
  const auto [n, size] = GetParam();
  auto store = std::make_shared<InMemoryKeyValueStore>();
  const std::string name = absl::StrCat("every-", n, "-", size);
  auto groups = CreateGroups(store, name, n);
  ASSERT_TRUE(AllCreated(groups));
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(groups[rank]->rank(), rank);
    EXPECT_EQ(groups[rank]->size(), n);
    EXPECT_EQ(groups[rank]->backend(), "store");
  }
  for (int round = 0; round < 2; ++round) {
    RunEveryCollective(groups, size, round);
  }
  // What is left is what a peer might still read: each rank's key of the
  // last barrier. A group of one touches no store.
  const std::vector<std::string> keys = store->Keys();
  ASSERT_THAT(keys, SizeIs(n == 1 ? 0 : n));
  for (const std::string& key : keys) {
    EXPECT_THAT(key, ContainsRegex("^" + name +
                                   "/[0-9a-f]{16}/[0-9]+/"
                                   "barrier/[0-9]+$"));
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndSizes, EveryCollectiveTest,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(size_t{0}, kMiB)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "Ranks",
                                               std::get<1>(info.param),
                                               "Bytes");
                         });

TEST(StoreProcessGroupTest, ThousandsOfCollectivesKeepTheStoreSmall) {
  constexpr int kRanks = 4;
  constexpr int kRounds = 500;
  auto store = std::make_shared<InMemoryKeyValueStore>();
  auto groups = CreateGroups(store, "many", kRanks);
  ASSERT_TRUE(AllCreated(groups));
  size_t most_keys = 0;
  OnThreads(kRanks, [&](int rank) {
    ProcessGroup& group = *groups[rank];
    for (int i = 0; i < kRounds; ++i) {
      // Sizes vary by rank and round: 0, 1 and 1000 bytes.
      const size_t size = (rank + i) % 3 == 0   ? 0
                          : (rank + i) % 3 == 1 ? 1
                                                : 1000;
      const int root = i % kRanks;
      auto gathered = group.Gather(Payload(rank, i, size), root);
      ASSERT_TRUE(gathered.ok()) << gathered.status();
      if (rank == root) {
        for (int r = 0; r < kRanks; ++r) {
          const size_t theirs = (r + i) % 3 == 0   ? 0
                                : (r + i) % 3 == 1 ? 1
                                                   : 1000;
          ASSERT_EQ((*gathered)[r], Payload(r, i, theirs));
        }
      }
      std::vector<std::string> parts;
      if (rank == (root + 1) % kRanks) {
        for (int r = 0; r < kRanks; ++r) parts.push_back(Payload(r, -i, 7));
      }
      auto scattered = group.Scatter(parts, (root + 1) % kRanks);
      ASSERT_TRUE(scattered.ok()) << scattered.status();
      ASSERT_EQ(*scattered, Payload(rank, -i, 7));
      auto broadcast =
          group.Broadcast(Payload(rank, i, 3), (root + 2) % kRanks);
      ASSERT_TRUE(broadcast.ok()) << broadcast.status();
      ASSERT_EQ(*broadcast, Payload((root + 2) % kRanks, i, 3));
      if (i % 5 == 4) {
        auto all = group.AllGather(Payload(rank, i, 5));
        ASSERT_TRUE(all.ok()) << all.status();
        ASSERT_EQ((*all)[(rank + 1) % kRanks],
                  Payload((rank + 1) % kRanks, i, 5));
      }
      if (rank == 0) most_keys = std::max(most_keys, store->KeyCount());
    }
    EXPECT_TRUE(group.Barrier().ok());
  });
  // A rank runs at most a few rounds ahead of the slowest (each 4 rounds it
  // waits for every rank as gather root), and a round holds at most 11
  // keys; without removal the store would hold thousands.
  EXPECT_LE(most_keys, 128u);
  EXPECT_EQ(store->KeyCount(), kRanks) << absl::StrJoin(store->Keys(), "\n");
}

TEST(StoreProcessGroupTest, ARunOfBroadcastsIsAcknowledgedEverySixteen) {
  constexpr int kRanks = 4;
  auto store = std::make_shared<InMemoryKeyValueStore>();
  auto groups = CreateGroups(store, "broadcasts", kRanks);
  ASSERT_TRUE(AllCreated(groups));
  OnThreads(kRanks, [&](int rank) {
    for (int i = 0; i < 100; ++i) {
      auto value = groups[rank]->Broadcast(Payload(rank, i, 9), /*root=*/0);
      ASSERT_TRUE(value.ok()) << value.status();
      ASSERT_EQ(*value, Payload(0, i, 9));
    }
  });
  // Call 96 (the 6th acknowledged one) let rank 0 remove calls 0 to 96;
  // calls 97 to 100 wait for a call that tells rank 0 every rank read them.
  const std::vector<std::string> keys = store->Keys();
  ASSERT_THAT(keys, SizeIs(4));
  for (int call = 97; call <= 100; ++call) {
    EXPECT_THAT(keys,
                Contains(EndsWith(absl::StrCat("/", call, "/broadcast/0"))));
  }
}

TEST(StoreProcessGroupTest, TwoGroupsWithDifferentNamesShareOneStore) {
  auto store = MakeInMemoryStore();
  std::vector<std::unique_ptr<ProcessGroup>> alpha, beta;
  // Both groups join at the same time.
  std::thread make_alpha([&] { alpha = CreateGroups(store, "alpha", 2); });
  beta = CreateGroups(store, "beta", 3);
  make_alpha.join();
  ASSERT_TRUE(AllCreated(alpha));
  ASSERT_TRUE(AllCreated(beta));
  OnThreads(5, [&](int thread) {
    const bool in_alpha = thread < 2;
    ProcessGroup& group = in_alpha ? *alpha[thread] : *beta[thread - 2];
    const int tag = in_alpha ? 1000 : 2000;
    for (int i = 0; i < 50; ++i) {
      auto all = group.AllGather(Payload(group.rank(), tag + i, 64));
      ASSERT_TRUE(all.ok()) << all.status();
      ASSERT_THAT(*all, SizeIs(group.size()));
      for (int r = 0; r < group.size(); ++r) {
        ASSERT_EQ((*all)[r], Payload(r, tag + i, 64));
      }
      auto broadcast =
          group.Broadcast(Payload(group.rank(), tag - i, 33), i % group.size());
      ASSERT_TRUE(broadcast.ok()) << broadcast.status();
      ASSERT_EQ(*broadcast, Payload(i % group.size(), tag - i, 33));
    }
  });
}

TEST(StoreProcessGroupTest, RecreatingAGroupOfTheSameNameStartsAfresh) {
  auto store = std::make_shared<InMemoryKeyValueStore>();
  for (int n : {2, 4}) {
    for (int generation = 0; generation < 3; ++generation) {
      auto groups = CreateGroups(store, "again", n);
      ASSERT_TRUE(AllCreated(groups));
      RunEveryCollective(groups, 100, generation);
    }  // Destroyed here.
  }
  // A second group of the name while the first lives.
  auto first = CreateGroups(store, "twice", 2);
  auto second = CreateGroups(store, "twice", 2);
  ASSERT_TRUE(AllCreated(first));
  ASSERT_TRUE(AllCreated(second));
  OnThreads(2, [&](int rank) {
    for (int i = 0; i < 20; ++i) {
      auto a = first[rank]->Broadcast(Payload(rank, i, 5), 0);
      auto b = second[rank]->Broadcast(Payload(rank, i, 6), 1);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      ASSERT_EQ(*a, Payload(0, i, 5));
      ASSERT_EQ(*b, Payload(1, i, 6));
    }
  });
}

TEST(StoreProcessGroupTest, KeysThatAnEarlierJobLeftAreNotRead) {
  // What a crashed job of the same name leaves: a join key with its nonce,
  // the welcome for it, and collective keys of its generation.
  const std::string old_nonce = "0123456789abcdef";
  const std::string old_generation = "fedcba9876543210";
  auto store = std::make_shared<ScriptedStore>();
  store->remove_unimplemented = true;
  ASSERT_TRUE(store->Set("stale/join/1", old_nonce + " 2").ok());
  ASSERT_TRUE(
      store->Set("stale/welcome/" + old_nonce, old_generation + " 2").ok());
  ASSERT_TRUE(store
                  ->Set("stale/" + old_generation + "/0/ready/0",
                        EncodeStatus(absl::OkStatus()))
                  .ok());
  ASSERT_TRUE(
      store->Set("stale/" + old_generation + "/1/broadcast/0", "old").ok());
  // Twice: the second creation also finds the first one's join key (this
  // store cannot remove it).
  for (int generation = 0; generation < 2; ++generation) {
    auto groups = CreateGroups(store, "stale", 2);
    ASSERT_TRUE(AllCreated(groups));
    OnThreads(2, [&](int rank) {
      auto value = groups[rank]->Broadcast(rank == 0 ? "new" : "", 0);
      ASSERT_TRUE(value.ok()) << value.status();
      EXPECT_EQ(*value, "new");
    });
  }
}

TEST(StoreProcessGroupTest, AStoreThatCannotRemoveKeysKeepsThemAndWorks) {
  auto store = std::make_shared<ScriptedStore>();
  store->remove_unimplemented = true;
  auto groups = CreateGroups(store, "keep", 2);
  ASSERT_TRUE(AllCreated(groups));
  RunEveryCollective(groups, 10, 0);
  // Joining: join, welcome, joined and ready; then per root a gather, a
  // scatter and a broadcast key; two all-gather and two barrier keys.
  EXPECT_EQ(store->inner.KeyCount(), 4u + 2 * 3 + 2 + 2);
}

TEST(StoreProcessGroupTest, GatherTimesOutNamingTheRankThatNeverCalled) {
  auto store = MakeInMemoryStore();
  auto groups = CreateGroups(store, "late", 4);
  ASSERT_TRUE(AllCreated(groups));
  // Ranks 1 and 2 hand in their payloads (a gather does not wait on a
  // non-root rank); rank 3 never calls.
  OnThreads(2, [&](int i) {
    auto gathered = groups[i + 1]->Gather("x", /*root=*/0);
    EXPECT_TRUE(gathered.ok()) << gathered.status();
  });
  auto gathered =
      groups[0]->Gather("x", /*root=*/0, /*timeout=*/absl::Milliseconds(1));
  EXPECT_EQ(gathered.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(gathered.status().message(),
              HasSubstr("gather on rank 0: timed out waiting for rank 3 "));
  // The group is broken: the next call fails at once, saying why.
  absl::Status barrier = groups[0]->Barrier();
  EXPECT_EQ(barrier.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(barrier.message(), HasSubstr("broken by an earlier failure"));
  EXPECT_THAT(barrier.message(), HasSubstr("waiting for rank 3 "));
}

TEST(StoreProcessGroupTest, AllGatherTimeoutNamesEveryMissingRank) {
  auto store = MakeInMemoryStore();
  auto groups = CreateGroups(store, "alone", 4);
  ASSERT_TRUE(AllCreated(groups));
  auto all = groups[2]->AllGather("x", absl::Milliseconds(1));
  EXPECT_EQ(all.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(all.status().message(),
              HasSubstr("allgather on rank 2: timed out waiting for ranks "
                        "0, 1, 3 "));
}

TEST(StoreProcessGroupTest, CreationTimesOutNamingTheMissingRank) {
  auto store = MakeInMemoryStore();
  auto zero =
      CreateStoreProcessGroup(store, 0, 2, {"lonely-0", absl::Milliseconds(1)});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(zero.status().message(),
              HasSubstr("join on rank 0: timed out waiting for rank 1 to "
                        "join store process group \"lonely-0\""));
  auto one =
      CreateStoreProcessGroup(store, 1, 2, {"lonely-1", absl::Milliseconds(1)});
  EXPECT_EQ(one.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(one.status().message(),
              HasSubstr("join on rank 1: timed out waiting for rank 0 "));
}

// How creating group `name` ended on rank 1 (told it has `rank1_size`
// ranks, with a long timeout) and on rank 0 (told `rank0_size`, with a 1 ms
// timeout). Rank 0 starts once rank 1 has announced itself, so it welcomes
// rank 1 before its deadline passes; other ranks never come.
struct JoinOutcome {
  absl::Status rank0;
  absl::Status rank1;
  // The store's keys once both creations returned.
  std::vector<std::string> keys_left;
};
JoinOutcome JoinWithImpatientRankZero(const std::string& name, int rank0_size,
                                      int rank1_size) {
  auto store = MakeInMemoryStore();
  JoinOutcome outcome;
  std::thread joiner([&] {
    outcome.rank1 =
        CreateStoreProcessGroup(store, 1, rank1_size, {name, kHang}).status();
  });
  EXPECT_TRUE(store->Get(name + "/join/1", kHang).ok());
  outcome.rank0 = CreateStoreProcessGroup(store, 0, rank0_size,
                                          {name, absl::Milliseconds(1)})
                      .status();
  joiner.join();
  outcome.keys_left = static_cast<InMemoryKeyValueStore&>(*store).Keys();
  return outcome;
}

TEST(StoreProcessGroupTest, RanksThatJoinedLearnWhyRankZeroGaveUp) {
  const JoinOutcome outcome = JoinWithImpatientRankZero("partial", 3, 3);
  EXPECT_EQ(outcome.rank0.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(outcome.rank0.message()),
              ContainsRegex("waiting for ranks? (1, )?2 to join"));
  EXPECT_EQ(outcome.rank1.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(outcome.rank1.message(),
              HasSubstr("join on rank 1: rank 0 gave up: "));
  EXPECT_THAT(std::string(outcome.rank1.message()),
              ContainsRegex("waiting for ranks? (1, )?2 to"));
}

TEST(StoreProcessGroupTest, SizeThatDiffersFromRankZerosIsInvalidArgument) {
  const JoinOutcome outcome = JoinWithImpatientRankZero("sizes", 2, 3);
  EXPECT_EQ(outcome.rank1.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outcome.rank1.message(),
              HasSubstr("with 2 ranks; this rank was given 3"));
  // Rank 0 fails as soon as it sees the size, naming the rank.
  EXPECT_EQ(outcome.rank0.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outcome.rank0.message(),
              HasSubstr("rank 1 was given 3 ranks for store process group "
                        "\"sizes\"; this rank was given 2"));
}

// A failed creation removes what it wrote (the join, welcome, joined and
// ready keys and the departures), so a long-lived store does not fill
// with failed attempts: rank 0 removes the record of why it gave up once
// every rank it welcomed has read it and said it left.
TEST(StoreProcessGroupTest, FailedCreationsLeaveNoKeys) {
  const JoinOutcome timed_out = JoinWithImpatientRankZero("gone", 3, 3);
  EXPECT_EQ(timed_out.rank0.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed_out.rank1.message(), HasSubstr("rank 0 gave up"));
  EXPECT_THAT(timed_out.keys_left, IsEmpty())
      << absl::StrJoin(timed_out.keys_left, "\n");

  const JoinOutcome sizes = JoinWithImpatientRankZero("gone-sizes", 2, 3);
  EXPECT_EQ(sizes.rank1.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sizes.keys_left, IsEmpty())
      << absl::StrJoin(sizes.keys_left, "\n");

  // Alone: rank 0 welcomed nobody and waits for nobody.
  auto store = std::make_shared<InMemoryKeyValueStore>();
  EXPECT_EQ(CreateStoreProcessGroup(store, 0, 2,
                                    {"gone-alone", absl::Milliseconds(1)})
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(store->Keys(), IsEmpty()) << absl::StrJoin(store->Keys(), "\n");
  // A rank whose rank 0 never came removes its join key.
  EXPECT_EQ(CreateStoreProcessGroup(store, 1, 2,
                                    {"gone-alone", absl::Milliseconds(1)})
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(store->Keys(), IsEmpty()) << absl::StrJoin(store->Keys(), "\n");
}

TEST(StoreProcessGroupTest, AStoreErrorAbortsTheCallAndBreaksTheGroup) {
  auto store = std::make_shared<ScriptedStore>();
  auto groups = CreateGroups(store, "faulty", 2);
  ASSERT_TRUE(AllCreated(groups));
  store->fail_sets_containing = "/broadcast/";
  auto value = groups[0]->Broadcast("x", 0);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(value.status().message()),
              ContainsRegex("^broadcast on rank 0: store set of key "
                            "\"faulty/[0-9a-f]{16}/1/broadcast/0\" failed: "
                            "INVALID_ARGUMENT: value refused by the test$"));
  EXPECT_EQ(groups[0]->Barrier().code(), absl::StatusCode::kAborted);
}

TEST(StoreProcessGroupTest, BadArgumentsAreInvalidArgument) {
  auto store = MakeInMemoryStore();
  EXPECT_EQ(CreateStoreProcessGroup(nullptr, 0, 1, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateStoreProcessGroup(store, 2, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateStoreProcessGroup(store, 0, 0, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateStoreProcessGroup(store, 0, 1, {"", absl::Seconds(1)})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateStoreProcessGroup(store, 0, 1, {"g", absl::ZeroDuration()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto groups = CreateGroups(store, "args", 2);
  ASSERT_TRUE(AllCreated(groups));
  // Argument errors do not break the group.
  EXPECT_EQ(groups[0]->Broadcast("x", 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  OnThreads(2, [&](int rank) { EXPECT_TRUE(groups[rank]->Barrier().ok()); });
}

TEST(InMemoryKeyValueStoreTest, GetWaitsForSetAndTimesOut) {
  InMemoryKeyValueStore store;
  EXPECT_EQ(store.Get("k", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread setter([&] { ASSERT_TRUE(store.Set("k", "v").ok()); });
  auto value = store.Get("k", kHang);
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
  ASSERT_TRUE(store.Set("empty", "").ok());
  EXPECT_EQ(store.KeyCount(), 2u);
  EXPECT_TRUE(store.Remove("k").ok());
  EXPECT_TRUE(store.Remove("never-set").ok());
  EXPECT_EQ(store.Keys(), std::vector<std::string>{"empty"});
  EXPECT_EQ(*store.Get("empty", absl::ZeroDuration()), "");
}

}  // namespace
}  // namespace dcp::comm
