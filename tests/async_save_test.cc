// AsyncSave: staging_completion means the bytes are in host memory (the
// caller may then change its tensors), upload_completion means committed;
// errors reach the right future; saves queue; destruction waits.
#include "engine/async_save.h"

#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "absl/synchronization/notification.h"
#include "comm/process_group.h"
#include "engine/checkpoint.h"
#include "engine/internal/group_turns.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "staging/cow_snapshot.h"
#include "tests/held_stager.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::HeldStager;
using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;

StateDict MakeState(uint64_t seed) {
  StateDict sd;
  sd["w"] = SeededTensor(DType::kF32, {256, 256}, seed);
  sd["b"] = SeededTensor(DType::kBF16, {1000}, seed + 1);
  sd["step"] = int64_t(seed);
  return sd;
}

StateDict LoadState(const std::string& dir) {
  StateDict sd;
  sd["w"] = Tensor::Empty(DType::kF32, {256, 256});
  sd["b"] = Tensor::Empty(DType::kBF16, {1000});
  sd["step"] = int64_t{0};
  LoadOptions options;
  options.checkpoint_id = dir;
  EXPECT_TRUE(Load(sd, options).ok());
  return sd;
}

void ExpectSameState(const StateDict& a, const StateDict& b) {
  EXPECT_TRUE(a.at("w").tensor().BytesEqual(b.at("w").tensor()));
  EXPECT_TRUE(a.at("b").tensor().BytesEqual(b.at("b").tensor()));
  EXPECT_EQ(a.at("step").int_value(), b.at("step").int_value());
}

// Every source tensor is overwritten right after staging_completion; the
// checkpoint must hold the values from before.
TEST(AsyncSave, MutatingAfterStagingKeepsOldValues) {
  for (bool pinned_async : {false, true}) {
    const std::string dir = MakeTempDir("async-mutate");
    StateDict live = MakeState(1);
    const StateDict expected = MakeState(1);
    StagingOptions staging =
        pinned_async ? StagingOptions{} : StagingOptions::AsyncSaveDefault();
    DefaultStager stager(staging);
    AsyncCheckpointer checkpointer;
    AsyncSaveOptions options;
    options.save.checkpoint_id = dir;
    options.async_stager = &stager;
    AsyncSaveResponse response = checkpointer.AsyncSave(live, options);
    ASSERT_TRUE(response.staging_completion.Wait().ok());
    std::memset(live["w"].tensor().data(), 0xAB, live["w"].tensor().nbytes());
    std::memset(live["b"].tensor().data(), 0xCD, live["b"].tensor().nbytes());
    live["step"] = int64_t{999};
    absl::StatusOr<Metadata> committed = response.upload_completion.Wait();
    ASSERT_TRUE(committed.ok()) << committed.status();
    ExpectSameState(LoadState(dir), expected);
    stager.Close();
  }
}

// With a copy-on-write stager staging completes before the tensors are
// copied; writes after it (the loop's next step) still do not reach the
// checkpoint.
TEST(AsyncSave, MutatingAfterCopyOnWriteStagingKeepsOldValues) {
  const bool available = CowSnapshotsAvailable().ok();
  for (bool async : {false, true}) {
    const std::string dir = MakeTempDir("async-cow");
    StateDict live = MakeState(3);
    live["big"] = SeededTensor(DType::kF32, {2048, 1024}, 7);  // 8 MiB.
    const Tensor big_expected = SeededTensor(DType::kF32, {2048, 1024}, 7);
    const StateDict expected = MakeState(3);
    StagingOptions staging = StagingOptions::AsyncSaveDefault();
    staging.use_async_staging = async;
    staging.copy_on_write = true;
    DefaultStager stager(staging);
    AsyncCheckpointer checkpointer;
    AsyncSaveOptions options;
    options.save.checkpoint_id = dir;
    options.async_stager = &stager;
    AsyncSaveResponse response = checkpointer.AsyncSave(live, options);
    ASSERT_TRUE(response.staging_completion.Wait().ok());
    for (const char* key : {"w", "b", "big"}) {
      std::memset(live[key].tensor().data(), 0xAB, live[key].tensor().nbytes());
    }
    absl::StatusOr<Metadata> committed = response.upload_completion.Wait();
    ASSERT_TRUE(committed.ok()) << committed.status();
    StateDict loaded = LoadState(dir);
    ExpectSameState(loaded, expected);
    StateDict big{{"big", Tensor::Empty(DType::kF32, {2048, 1024})}};
    LoadOptions load;
    load.checkpoint_id = dir;
    ASSERT_TRUE(Load(big, load).ok());
    EXPECT_TRUE(big["big"].tensor().BytesEqual(big_expected));
    // Without userfaultfd the stager copies; with it the large tensor's
    // whole pages were snapshot.
    if (available) {
      EXPECT_GE(stager.copy_on_write_bytes(), (size_t{8} << 20) - 4096);
    } else {
      EXPECT_EQ(stager.copy_on_write_bytes(), 0u);
    }
    stager.Close();
  }
}

TEST(AsyncSave, SecondSaveQueuesBehindFirstAndBothCommit) {
  const std::string dir1 = MakeTempDir("async-q1");
  const std::string dir2 = MakeTempDir("async-q2");
  AsyncCheckpointer checkpointer;
  AsyncSaveOptions o1, o2;
  o1.save.checkpoint_id = dir1;
  o2.save.checkpoint_id = dir2;
  StateDict s1 = MakeState(10), s2 = MakeState(20);
  AsyncSaveResponse r1 = checkpointer.AsyncSave(s1, o1);
  AsyncSaveResponse r2 = checkpointer.AsyncSave(s2, o2);
  ASSERT_TRUE(r2.upload_completion.Wait().ok());
  // Uploads run in call order: the first is done when the second is.
  EXPECT_TRUE(r1.upload_completion.ready());
  ASSERT_TRUE(r1.upload_completion.Wait().ok());
  ExpectSameState(LoadState(dir1), MakeState(10));
  ExpectSameState(LoadState(dir2), MakeState(20));
}

// A Save on the group of an AsyncSave whose upload has not run yet waits
// for that upload: their collectives never interleave
// (engine/internal/group_turns.h).
TEST(AsyncSave, ASaveOnTheGroupWaitsForTheUploadSubmittedBefore) {
  const std::string dir1 = MakeTempDir("async-turn1");
  const std::string dir2 = MakeTempDir("async-turn2");
  comm::LocalProcessGroup group;
  AsyncCheckpointer checkpointer;
  HeldStager stager;
  AsyncSaveOptions o1;
  o1.save.checkpoint_id = dir1;
  o1.save.process_group = &group;
  o1.async_stager = &stager;
  const StateDict s1 = MakeState(10);
  absl::Notification waiting;
  std::once_flag once;
  auto notify = [&] { std::call_once(once, [&] { waiting.Notify(); }); };
  internal::SetGroupTurnWaitObserverForTesting(notify);
  AsyncSaveResponse r1 = checkpointer.AsyncSave(s1, o1);
  // The upload's stage is released once the Save below waits for it.
  std::thread release([&] {
    waiting.WaitForNotification();
    stager.Release(s1);
  });
  SaveOptions o2;
  o2.checkpoint_id = dir2;
  o2.process_group = &group;
  const absl::Status saved = Save(MakeState(20), o2).status();
  const bool first_committed = std::filesystem::exists(dir1 + "/.metadata");
  notify();  // Releases the stage if the Save did not wait.
  release.join();
  internal::SetGroupTurnWaitObserverForTesting(nullptr);
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_TRUE(first_committed)
      << "the Save ran before the upload submitted before it";
  ASSERT_TRUE(r1.upload_completion.Wait().ok());
  ExpectSameState(LoadState(dir1), MakeState(10));
  ExpectSameState(LoadState(dir2), MakeState(20));
}

// Two AsyncSaves on one group (the first staged by a HeldStager, so the
// test says when its staging lands) and a Save that a callback of the
// first makes on the same group, each into a directory of its own.
struct SavesOnOneGroup {
  explicit SavesOnOneGroup(const std::string& tag)
      : dir1(MakeTempDir(tag + "1")),
        dir2(MakeTempDir(tag + "2")),
        dir3(MakeTempDir(tag + "3")) {
    first.save.checkpoint_id = dir1;
    first.save.process_group = &group;
    first.async_stager = &stager;
    second.save.checkpoint_id = dir2;
    second.save.process_group = &group;
  }
  // The callback's Save, of MakeState(value) into dir3.
  absl::Status SaveFromCallback(int value) {
    SaveOptions options;
    options.checkpoint_id = dir3;
    options.process_group = &group;
    return Save(MakeState(value), options).status();
  }
  void ExpectSaved(int first_value, int second_value, int callback_value) {
    ExpectSameState(LoadState(dir1), MakeState(first_value));
    ExpectSameState(LoadState(dir2), MakeState(second_value));
    ExpectSameState(LoadState(dir3), MakeState(callback_value));
  }

  const std::string dir1, dir2, dir3;
  comm::LocalProcessGroup group;
  HeldStager stager;
  AsyncSaveOptions first, second;
  AsyncCheckpointer checkpointer;  // Last: its uploads use the above.
};

// A callback of an upload's completion runs in the upload's turn on the
// upload thread: a Save it makes on the group runs there and then, even
// with another AsyncSave on the group queued behind (it would otherwise
// wait for that upload, which waits for this thread).
TEST(AsyncSave, ACompletionCallbackMaySaveOnTheGroup) {
  SavesOnOneGroup t("async-cb");
  const StateDict s1 = MakeState(10);
  AsyncSaveResponse r1 = t.checkpointer.AsyncSave(s1, t.first);
  absl::Notification called;
  absl::Status in_callback = absl::UnknownError("not called");
  r1.upload_completion.OnReady([&](const absl::StatusOr<Metadata>&) {
    in_callback = t.SaveFromCallback(30);
    called.Notify();
  });
  AsyncSaveResponse r2 = t.checkpointer.AsyncSave(MakeState(20), t.second);
  t.stager.Release(s1);  // The first upload runs, then its callback.
  called.WaitForNotification();
  EXPECT_TRUE(in_callback.ok()) << in_callback;
  ASSERT_TRUE(r2.upload_completion.Wait().ok());
  t.ExpectSaved(10, 20, 30);
}

// A callback of staging_completion may save on the group, even with
// another AsyncSave queued before its save: that upload's staging lands on
// a thread of its own while the callback waits for its turn.
TEST(AsyncSave, AStagingCallbackMaySaveOnTheGroup) {
  SavesOnOneGroup t("async-scb");
  const StateDict s1 = MakeState(11);
  AsyncSaveResponse r1 = t.checkpointer.AsyncSave(s1, t.first);
  absl::Notification second_queued, called;
  absl::Status in_callback = absl::UnknownError("not called");
  r1.staging_completion.OnReady([&](const absl::Status&) {
    second_queued.WaitForNotification();
    in_callback = t.SaveFromCallback(31);
    called.Notify();
  });
  t.stager.Release(s1);  // Staging 1 lands: the callback runs and waits.
  AsyncSaveResponse r2 = t.checkpointer.AsyncSave(MakeState(21), t.second);
  second_queued.Notify();
  called.WaitForNotification();
  EXPECT_TRUE(in_callback.ok()) << in_callback;
  ASSERT_TRUE(r1.upload_completion.Wait().ok());
  ASSERT_TRUE(r2.upload_completion.Wait().ok());
  t.ExpectSaved(11, 21, 31);
}

TEST(AsyncSave, DestructionWaitsForUploadsInFlight) {
  const std::string dir = MakeTempDir("async-destroy");
  Future<Metadata> upload;
  {
    AsyncCheckpointer checkpointer;
    AsyncSaveOptions options;
    options.save.checkpoint_id = dir;
    upload = checkpointer.AsyncSave(MakeState(3), options).upload_completion;
  }
  ASSERT_TRUE(upload.ready());
  EXPECT_TRUE(upload.Wait().ok());
  ExpectSameState(LoadState(dir), MakeState(3));
}

// With no thread to be had for the wait for its staging (a thread or
// process limit), the save waits in the call: staging is complete when
// AsyncSave returns, the upload commits, and the checkpointer's destruction
// does not wait for a waiter that never ran.
TEST(AsyncSave, AStagingWaitWithoutAThreadRunsInTheCall) {
  const std::string dir = MakeTempDir("async-no-thread");
  internal::RefuseStagingWaiterThreadsForTesting(true);
  {
    AsyncCheckpointer checkpointer;
    AsyncSaveOptions options;
    options.save.checkpoint_id = dir;
    AsyncSaveResponse response = checkpointer.AsyncSave(MakeState(5), options);
    EXPECT_TRUE(response.staging_completion.ready());
    EXPECT_TRUE(response.staging_completion.Wait().ok());
    absl::StatusOr<Metadata> committed = response.upload_completion.Wait();
    EXPECT_TRUE(committed.ok()) << committed.status();
  }
  internal::RefuseStagingWaiterThreadsForTesting(false);
  ExpectSameState(LoadState(dir), MakeState(5));
}

// A checkpoint_id given with a storage writer points the writer there, as
// it does for Save.
TEST(AsyncSave, CheckpointIdRedirectsAGivenWriter) {
  const std::string configured = MakeTempDir("async-writer-configured");
  const std::string chosen = MakeTempDir("async-checkpoint-id");
  FileSystemWriter writer(configured);
  AsyncCheckpointer checkpointer;
  AsyncSaveOptions options;
  options.save.checkpoint_id = chosen;
  options.save.storage_writer = &writer;
  absl::StatusOr<Metadata> committed =
      checkpointer.AsyncSave(MakeState(6), options).upload_completion.Wait();
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(testing::ListFiles(configured).empty());
  ExpectSameState(LoadState(chosen), MakeState(6));
}

TEST(AsyncSave, WaitForPendingReturnsOnceEveryQueuedUploadFinished) {
  const std::string dir1 = MakeTempDir("async-drain1");
  const std::string dir2 = MakeTempDir("async-drain2");
  AsyncCheckpointer checkpointer;
  AsyncSaveOptions o1, o2;
  o1.save.checkpoint_id = dir1;
  o2.save.checkpoint_id = dir2;
  Future<Metadata> u1 =
      checkpointer.AsyncSave(MakeState(11), o1).upload_completion;
  Future<Metadata> u2 =
      checkpointer.AsyncSave(MakeState(12), o2).upload_completion;
  checkpointer.WaitForPending();
  ASSERT_TRUE(u1.ready());
  ASSERT_TRUE(u2.ready());
  EXPECT_TRUE(u1.Wait().ok()) << u1.Wait().status();
  EXPECT_TRUE(u2.Wait().ok()) << u2.Wait().status();
}

// Shutdown fails what has not started at once and runs none of it, waits
// for what runs, and refuses later saves without staging them.
TEST(AsyncSave, ShutdownCancelsUploadsNotStartedAndRefusesNewOnes) {
  const std::string held_dir = MakeTempDir("async-shutdown-held");
  const std::string queued_dir = MakeTempDir("async-shutdown-queued");
  const StateDict state = MakeState(13);
  HeldStager held;
  AsyncCheckpointer checkpointer;
  AsyncSaveOptions first;
  first.save.checkpoint_id = held_dir;
  first.async_stager = &held;
  Future<Metadata> held_upload =
      checkpointer.AsyncSave(state, first).upload_completion;
  AsyncSaveOptions second;
  second.save.checkpoint_id = queued_dir;
  Future<Metadata> queued_upload =
      checkpointer.AsyncSave(state, second).upload_completion;

  std::thread shutdown([&] { checkpointer.Shutdown(); });
  // Resolved by Shutdown while the first upload still waits for staging.
  absl::Status queued = queued_upload.Wait().status();
  EXPECT_EQ(queued.code(), absl::StatusCode::kCancelled) << queued;
  held.Release(state);
  shutdown.join();
  // Shutdown returned after the first upload: committed if it had started,
  // cancelled if not.
  ASSERT_TRUE(held_upload.ready());
  EXPECT_FALSE(testing::ListFiles(queued_dir).count(".metadata"));

  HeldStager never;
  AsyncSaveOptions later;
  later.save.checkpoint_id = queued_dir;
  later.async_stager = &never;
  AsyncSaveResponse refused = checkpointer.AsyncSave(state, later);
  ASSERT_TRUE(refused.staging_completion.ready());
  EXPECT_EQ(refused.staging_completion.Wait().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(refused.upload_completion.Wait().status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(never.stage_calls.load(), 0);
}

TEST(AsyncSave, WriteErrorReachesUploadFutureOnly) {
  AsyncCheckpointer checkpointer;
  AsyncSaveOptions options;
  options.save.checkpoint_id = "/proc/dcp-cannot-write-here";
  AsyncSaveResponse response = checkpointer.AsyncSave(MakeState(4), options);
  EXPECT_TRUE(response.staging_completion.Wait().ok());
  absl::Status upload = response.upload_completion.Wait().status();
  EXPECT_FALSE(upload.ok());
  EXPECT_NE(upload.message().find("/proc/dcp-cannot-write-here"),
            absl::string_view::npos)
      << upload;
}

TEST(AsyncSave, StagingErrorReachesBothFutures) {
  AsyncCheckpointer checkpointer;
  AsyncSaveOptions options;
  options.save.checkpoint_id = MakeTempDir("async-bad");
  StateDict bad;
  // A tensor on a device the host runtime does not have.
  bad["w"] = Tensor::Wrap(TensorView(reinterpret_cast<void*>(0x1000),
                                     DType::kF32, {4}, Device::Cuda(7)));
  AsyncSaveResponse response = checkpointer.AsyncSave(bad, options);
  absl::Status staging = response.staging_completion.Wait();
  EXPECT_EQ(staging.code(), absl::StatusCode::kInvalidArgument) << staging;
  EXPECT_EQ(response.upload_completion.Wait().status(), staging);
  EXPECT_TRUE(testing::ListFiles(options.save.checkpoint_id).empty());
}

TEST(AsyncSave, ProcessExecutorIsUnimplemented) {
  AsyncCheckpointer checkpointer;
  AsyncSaveOptions options;
  options.save.checkpoint_id = MakeTempDir("async-process");
  options.async_checkpointer_type = AsyncCheckpointerType::kProcess;
  AsyncSaveResponse response = checkpointer.AsyncSave(MakeState(5), options);
  EXPECT_EQ(response.upload_completion.Wait().status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace dcp
