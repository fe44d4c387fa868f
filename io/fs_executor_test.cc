// FileSystemWriter/Reader on an injected executor, and RunWorkers
// (io/internal/parallel_work.h).
#include <atomic>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/executor.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "io/internal/parallel_work.h"
#include "io/testing/fake_planners.h"
#include "io/testing/sample_state.h"

namespace dcp {
namespace {

using ::dcp::testing::FakeLoadPlanner;
using ::dcp::testing::FakeSavePlanner;
using ::dcp::testing::ListNames;
using ::dcp::testing::NewTestDir;
using ::dcp::testing::SampleState;

// Holds every task until the test runs them, in order, on its own thread.
class QueueExecutor final : public Executor {
 public:
  void Schedule(Task task) override {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }
  // Runs tasks, those they schedule included, until none is left; how many.
  int RunAll() {
    int ran = 0;
    for (;;) {
      Task task;
      {
        absl::MutexLock lock(&mu_);
        if (tasks_.empty()) return ran;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      std::move(task)();
      ++ran;
    }
  }

 private:
  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
};

TEST(FsExecutorTest, WriteDataAndReadDataRunOnTheExecutorNotTheCaller) {
  const std::string dir = NewTestDir("executor");
  const SampleState sample = SampleState::Make(3);
  QueueExecutor executor;
  FileSystemWriterOptions options;
  options.executor = &executor;
  options.thread_count = 3;  // Helpers the queue starts late are skipped.
  FileSystemWriter writer(dir, options);
  FakeSavePlanner planner = sample.SavePlanner();
  ASSERT_TRUE(writer.SetUp(true, 0, false).ok());
  auto global = *planner.CreateGlobalPlan({*planner.CreateLocalPlan()});
  std::vector<SavePlan> plans = *writer.PrepareGlobalPlan(global.first);
  const SavePlan final_plan = *planner.FinishPlan(plans[0]);
  Future<std::vector<WriteResult>> written =
      writer.WriteData(final_plan, planner);
  EXPECT_FALSE(written.ready());
  // The directory lock and the save's marker only.
  EXPECT_EQ(ListNames(dir).size(), 2u);
  EXPECT_GE(executor.RunAll(), 1);
  ASSERT_TRUE(written.ready());
  ASSERT_TRUE(written.Wait().ok()) << written.Wait().status();
  ASSERT_TRUE(writer.Finish(global.second, {*written.Wait()}).ok());
  ASSERT_TRUE(writer.MarkCommitted().ok());

  FileSystemReaderOptions read_options;
  read_options.executor = &executor;
  read_options.thread_count = 2;
  FileSystemReader reader(dir, read_options);
  absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  ASSERT_TRUE(reader.SetUp(*metadata, true).ok());
  FakeLoadPlanner load;
  std::map<std::string, Tensor> dests = sample.Destinations(load);
  const LoadPlan plan = ::dcp::testing::WholeItemLoadPlan(*metadata);
  Future<void> read = reader.ReadData(plan, load);
  EXPECT_FALSE(read.ready());
  EXPECT_GE(executor.RunAll(), 1);
  ASSERT_TRUE(read.ready());
  ASSERT_TRUE(read.Wait().ok()) << read.Wait();
  for (const auto& [name, tensor] : sample.tensors) {
    EXPECT_TRUE(dests.at(name).BytesEqual(tensor)) << name;
  }
}

TEST(FsExecutorTest, ReadDataBeforeSetUpFailsThroughTheFuture) {
  QueueExecutor executor;
  FileSystemReaderOptions options;
  options.executor = &executor;
  FileSystemReader reader(NewTestDir("executor_no_setup"), options);
  FakeLoadPlanner load;
  const LoadPlan plan;
  Future<void> read = reader.ReadData(plan, load);
  EXPECT_FALSE(read.ready());
  executor.RunAll();
  EXPECT_EQ(read.Wait().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RunWorkersTest, AOneThreadPoolCallingItFromItsOwnTaskDoesEveryItemOnce) {
  ThreadPool pool(1);
  constexpr int kItems = 100;
  std::vector<std::atomic<int>> done(kItems);
  Promise<void> finished;
  pool.Schedule([&] {
    std::atomic<int> next{0};
    // Workers 1..3 cannot start while this task holds the only thread.
    internal_io::RunWorkers(pool, 4, [&](int) {
      for (int i = next++; i < kItems; i = next++) done[i]++;
    });
    finished.Set(absl::OkStatus());
  });
  ASSERT_TRUE(finished.future().Wait().ok());
  for (int i = 0; i < kItems; ++i) EXPECT_EQ(done[i].load(), 1) << i;
}

TEST(RunWorkersTest, WorkersRunOnTheExecutorWhenItHasThreads) {
  ThreadPool pool(3);
  std::atomic<int> calls{0};
  std::atomic<int> next{0};
  std::atomic<int> sum{0};
  internal_io::RunWorkers(pool, 4, [&](int) {
    ++calls;
    for (int i = next++; i < 1000; i = next++) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
  EXPECT_GE(calls.load(), 1);
  EXPECT_LE(calls.load(), 4);
}

}  // namespace
}  // namespace dcp
