// Turns off abseil's Mutex deadlock detection for every program that links
// dcp. Debian's abseil (20220623) was built with it on: each Mutex lock
// then walks a lock-order graph whose size grows with the number of live
// Mutexes, and a save holds one per pending write (a Future each), which
// made saves of many small tensors superlinear (docs/BENCHMARKS.md
// section 6).
// DCP_ABSL_DEADLOCK_DETECTION=1 (or "abort") keeps it on, to hunt
// lock-order bugs.
#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"

namespace dcp {
namespace {

[[maybe_unused]] const bool kDeadlockDetectionSet = [] {
  const char* env = std::getenv("DCP_ABSL_DEADLOCK_DETECTION");
  absl::OnDeadlockCycle mode = absl::OnDeadlockCycle::kIgnore;
  if (env != nullptr && std::strcmp(env, "abort") == 0) {
    mode = absl::OnDeadlockCycle::kAbort;
  } else if (env != nullptr && std::strcmp(env, "1") == 0) {
    mode = absl::OnDeadlockCycle::kReport;
  }
  absl::SetMutexDeadlockDetectionMode(mode);
  return true;
}();

}  // namespace
}  // namespace dcp
