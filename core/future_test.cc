#include "core/future.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

// A pool whose threads cannot all start throws (for the C ABI to report)
// instead of terminating the process with the started threads joinable.
// In a child whose address space is too small for 4096 thread stacks.
TEST(ThreadPool, ThreadsThatCannotStartAreAnExceptionNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers need more address space than the limit leaves";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "sanitizers need more address space than the limit leaves";
#endif
#endif
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    long pages = 0;
    if (FILE* statm = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(statm, "%ld", &pages) != 1) pages = 0;
      std::fclose(statm);
    }
    const rlim_t now = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE);
    const rlimit limit{now + (rlim_t{256} << 20), now + (rlim_t{256} << 20)};
    if (pages == 0 || setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
    try {
      ThreadPool pool(4096);
      _exit(pool.num_threads() == 4096 ? 4 : 5);  // Started: no test.
    } catch (const std::exception&) {
      _exit(0);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status))
      << "the child died of signal "
      << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

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
