#include "core/future.h"

#include <optional>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

TEST(Future, CallbackBeforeAndAfterReady) {
  Promise<int> promise;
  Future<int> future = promise.future();
  int seen = 0;
  future.OnReady([&](const absl::StatusOr<int>& r) { seen = *r; });
  EXPECT_FALSE(future.ready());
  EXPECT_TRUE(promise.Set(41));
  EXPECT_EQ(seen, 41);
  EXPECT_FALSE(promise.Set(5));  // First result wins.
  int late = 0;
  future.OnReady([&](const absl::StatusOr<int>& r) { late = *r + 1; });
  EXPECT_EQ(late, 42);
}

TEST(Future, ThenOnThreadPoolAndWait) {
  ThreadPool pool(2);
  Promise<int> promise;
  Future<std::string> chained = promise.future().Then<std::string>(
      pool, [](const absl::StatusOr<int>& r) -> absl::StatusOr<std::string> {
        if (!r.ok()) return r.status();
        return std::to_string(*r * 2);
      });
  std::thread setter([&] { promise.Set(21); });
  EXPECT_EQ(*chained.Wait(), "42");
  setter.join();
}

TEST(Future, ErrorsPropagateThroughThen) {
  Future<int> failed = Future<int>::Ready(absl::DataLossError("torn"));
  Future<void> after = failed.Then<void>(
      InlineExecutorInstance(),
      [](const absl::StatusOr<int>& r) { return r.status(); });
  EXPECT_EQ(after.Wait().code(), absl::StatusCode::kDataLoss);
}

TEST(WhenAll, FirstErrorInInputOrder) {
  Promise<void> a, b, c;
  Future<void> all =
      WhenAll(std::vector<Future<void>>{a.future(), b.future(), c.future()});
  c.Set(absl::InternalError("c"));
  a.Set(absl::OkStatus());
  EXPECT_FALSE(all.ready());
  b.Set(absl::UnavailableError("b"));
  EXPECT_EQ(all.Wait().message(), "b");
  EXPECT_TRUE(WhenAll(std::vector<Future<int>>{}).Wait().ok());
}

TEST(Future, DroppedPromiseResolvesWithCancelled) {
  Future<int> future;
  {
    Promise<int> promise;
    future = promise.future();
  }
  ASSERT_TRUE(future.ready());
  EXPECT_EQ(future.Wait().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(future.Wait().status().message(),
            "promise destroyed without a value");
}

TEST(Future, BrokenOnlyWhenTheLastPromiseCopyGoes) {
  Future<void> future;
  Future<void> also;
  std::optional<Promise<void>> copy;
  {
    Promise<void> promise;
    future = promise.future();
    also = future;  // Futures do not keep the promise alive.
    copy = promise;
  }
  EXPECT_FALSE(future.ready());
  copy.reset();
  ASSERT_TRUE(also.ready());
  EXPECT_EQ(also.Wait().code(), absl::StatusCode::kCancelled);
}

TEST(Future, FulfilledPromiseKeepsItsValueWhenDropped) {
  Future<int> future;
  {
    Promise<int> promise;
    future = promise.future();
    promise.Set(7);
  }
  EXPECT_EQ(*future.Wait(), 7);
}

TEST(Future, TaskDroppedByItsExecutorBreaksThen) {
  // An executor that drops its tasks: the continuation's promise goes with
  // the task, so the chained future resolves instead of waiting forever.
  class DroppingExecutor final : public Executor {
   public:
    void Schedule(Task) override {}
  } dropping;
  Future<int> chained = Future<int>::Ready(1).Then<int>(
      dropping, [](const absl::StatusOr<int>& r) { return r; });
  ASSERT_TRUE(chained.ready());
  EXPECT_EQ(chained.Wait().status().code(), absl::StatusCode::kCancelled);
}

TEST(Future, WaitForTimesOut) {
  Promise<void> p;
  EXPECT_FALSE(p.future().WaitFor(absl::Milliseconds(5)));
}

TEST(Future, WaitAllReturnsTheFirstErrorOnlyOnceEveryFutureIsReady) {
  Promise<size_t> later;
  std::vector<Future<size_t>> futures = {
      Future<size_t>::Ready(absl::DataLossError("first")), later.future(),
      Future<size_t>::Ready(absl::InternalError("third"))};
  std::thread setter([later] { later.Set(size_t{7}); });
  absl::StatusOr<std::vector<size_t>> values = WaitAll(futures);
  // The failed future came first, yet WaitAll waited for the pending one.
  EXPECT_TRUE(futures[1].ready());
  setter.join();
  ASSERT_FALSE(values.ok());
  EXPECT_EQ(values.status().message(), "first");
  EXPECT_THAT(
      *WaitAll(std::vector<Future<size_t>>{Future<size_t>::Ready(size_t{1}),
                                           Future<size_t>::Ready(size_t{2})}),
      ::testing::ElementsAre(1, 2));
}

}  // namespace
}  // namespace dcp
