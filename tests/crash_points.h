// Crash-point enumeration for storage writers: a save is run once per
// file-system call it makes, the process dying at that call (the call and
// every later one fail, nothing is cleaned up) and the power going right
// after (FaultInjectionFileSystem::SimulateCrash drops what was not made
// durable). The caller checks what the directory holds after each one.
#ifndef DCP_TESTS_CRASH_POINTS_H_
#define DCP_TESTS_CRASH_POINTS_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "io/fault_injection.h"
#include "io/file_system.h"

namespace dcp::testing {

struct CrashPoint {
  // The save died at its `call`-th file-system call (1-based).
  int64_t call = 0;
  // The save made fewer than `call` calls: it never reached the crash
  // (the power still goes) and `status` should be OK. The last point of
  // an enumeration.
  bool completed = false;
  // What the save returned (the injected failure, for a crash).
  absl::Status status;
  // The file system the save ran on; its calls(op) count what the save
  // did, the failed calls after the crash included.
  const FaultInjectionFileSystem* file_system = nullptr;
};

// For call = 1, 2, ...: `prepare()` puts the previous state in place
// (through the local file system, not the faulty one); `save(fs)` runs one
// save through `fs`, a fresh FaultInjectionFileSystem over the local file
// system whose `call`-th call and every later one fail (Fault::crash), and
// must not Abort or otherwise clean up after a failure (a killed process
// does not); the writer must be destroyed before `save` returns. Then the
// power goes and `check(point)` inspects the directory. Stops after the
// first save that ends before its crash call (that point is checked too)
// and returns the number of points checked. Runs on the calling
// thread.
int64_t ForEachCrashPoint(
    absl::FunctionRef<void()> prepare,
    absl::FunctionRef<absl::Status(FileSystemBase& fs)> save,
    absl::FunctionRef<void(const CrashPoint& point)> check);

}  // namespace dcp::testing

#endif  // DCP_TESTS_CRASH_POINTS_H_
