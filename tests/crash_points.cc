#include "tests/crash_points.h"

#include <cerrno>

namespace dcp::testing {

int64_t ForEachCrashPoint(
    absl::FunctionRef<void()> prepare,
    absl::FunctionRef<absl::Status(FileSystemBase& fs)> save,
    absl::FunctionRef<void(const CrashPoint& point)> check) {
  for (int64_t call = 1;; ++call) {
    prepare();
    FaultInjectionFileSystem faulty(LocalFileSystem());
    Fault crash;
    crash.op = FaultOp::kAny;
    crash.error = EIO;
    crash.nth = call;
    crash.crash = true;
    faulty.Inject(crash);
    CrashPoint point;
    point.call = call;
    point.status = save(faulty);
    point.completed = faulty.calls(FaultOp::kAny) < call;
    point.file_system = &faulty;
    faulty.ClearFaults();
    faulty.SimulateCrash();
    check(point);
    if (point.completed) return call;
  }
}

}  // namespace dcp::testing
