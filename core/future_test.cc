#include "core/future.h"

#include <thread>

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

TEST(Future, WaitForTimesOut) {
  Promise<void> p;
  EXPECT_FALSE(p.future().WaitFor(absl::Milliseconds(5)));
}

}  // namespace
}  // namespace dcp
