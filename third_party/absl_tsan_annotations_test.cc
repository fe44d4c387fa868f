// What absl_tsan_annotations.cc tells ThreadSanitizer, checked under
// --config=tsan (tools/sanitize.sh tsan): without it these report races.
// Built and run in every configuration.
#include <atomic>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace {

// A flag whose synchronization ThreadSanitizer does not see (these
// functions are not instrumented), so that a test orders two threads
// without giving TSan a happens-before edge of its own.
__attribute__((no_sanitize("thread"))) void SetUnseen(std::atomic<int>* flag) {
  flag->store(1, std::memory_order_release);
}

__attribute__((no_sanitize("thread"))) void WaitUnseen(std::atomic<int>* flag) {
  while (flag->load(std::memory_order_acquire) == 0) std::this_thread::yield();
}

TEST(AbslTsanAnnotationsTest, StatusDeletedAfterAnotherThreadDroppedItsCopy) {
  const std::string message(100, 'm');  // Not inlined: a shared heap rep.
  absl::Status status = absl::DataLossError(message);
  std::atomic<int> dropped{0};
  size_t seen = 0;
  std::thread reader([copy = status, &dropped, &seen]() mutable {
    seen = copy.message().size();
    copy = absl::OkStatus();  // Drops this thread's reference.
    SetUnseen(&dropped);
  });
  WaitUnseen(&dropped);
  status = absl::OkStatus();  // The last reference: deletes the rep here.
  reader.join();
  EXPECT_EQ(seen, message.size());
}

}  // namespace
