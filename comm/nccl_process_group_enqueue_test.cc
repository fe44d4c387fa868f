// NcclProcessGroup on a non-blocking communicator whose collectives return
// ncclInProgress and reach the stream only later (as NCCL's own thread
// enqueues them): a fake NCCL that enqueues the collective's copy when
// ncclCommGetAsyncError is next polled, over the host DeviceRuntime. The
// group must wait for that work itself, within its deadline, and not for
// an event recorded before the work was on the stream.
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "comm/internal/nccl_library.h"
#include "comm/nccl_process_group.h"
#include "cuda/host_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::comm {
namespace {

using ::testing::HasSubstr;

// One rank; the collective NCCL has accepted but not yet enqueued.
struct LateWorld {
  absl::Mutex mu;
  DeviceRuntime* runtime = nullptr;  // The group's (host) runtime.
  bool pending = false;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;
  cudaStream_t stream = nullptr;
  int aborts = 0;
};

LateWorld& World() {
  static auto* world = new LateWorld;
  return *world;
}

ncclResult_t LateGetUniqueId(ncclUniqueId* id) {
  std::random_device random;
  for (char& byte : id->internal) byte = static_cast<char>(random());
  return ncclSuccess;
}

ncclResult_t LateInit(ncclComm_t* comm, int, ncclUniqueId, int, ncclConfig_t*) {
  static int token = 0;
  *comm = reinterpret_cast<ncclComm_t>(&token);
  return ncclSuccess;
}

ncclResult_t LateAbort(ncclComm_t) {
  absl::MutexLock lock(&World().mu);
  ++World().aborts;
  return ncclSuccess;
}

// The first poll after a collective enqueues it (one rank: all-gather and
// broadcast copy send to recv) and still reports ncclInProgress.
ncclResult_t LateAsyncError(ncclComm_t, ncclResult_t* state) {
  LateWorld& w = World();
  absl::MutexLock lock(&w.mu);
  *state = ncclSuccess;
  if (!w.pending) return ncclSuccess;
  w.pending = false;
  *state = ncclInProgress;
  if (w.send == w.recv) return ncclSuccess;
  const absl::Status copied =
      w.runtime->CopyAsync(w.recv, w.send, w.bytes, CopyKind::kDeviceToDevice,
                           reinterpret_cast<DeviceStream*>(w.stream));
  return copied.ok() ? ncclSuccess : ncclUnhandledCudaError;
}

const char* LateErrorString(ncclResult_t) { return "fake nccl error"; }
const char* LateLastError(ncclComm_t) { return ""; }

ncclResult_t Accept(const void* send, void* recv, size_t bytes,
                    cudaStream_t stream) {
  LateWorld& w = World();
  absl::MutexLock lock(&w.mu);
  w.pending = true;
  w.send = send;
  w.recv = recv;
  w.bytes = bytes;
  w.stream = stream;
  return ncclInProgress;
}

ncclResult_t LateAllGather(const void* send, void* recv, size_t count,
                           ncclDataType_t type, ncclComm_t,
                           cudaStream_t stream) {
  return Accept(send, recv, count * (type == ncclUint64 ? 8 : 1), stream);
}

ncclResult_t LateBroadcast(const void* send, void* recv, size_t count,
                           ncclDataType_t type, int, ncclComm_t,
                           cudaStream_t stream) {
  return Accept(send, recv, count * (type == ncclUint64 ? 8 : 1), stream);
}

ncclResult_t Unused(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                    cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t UnusedRecv(void*, size_t, ncclDataType_t, int, ncclComm_t,
                        cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t NoGroup() { return ncclSuccess; }

const internal::NcclLibrary& LateNccl() {
  static const internal::NcclLibrary* nccl = [] {
    auto* lib = new internal::NcclLibrary{};
    lib->path = "fake-late";
    lib->version = 1;
    lib->GetUniqueId = LateGetUniqueId;
    lib->CommInitRankConfig = LateInit;
    lib->CommAbort = LateAbort;
    lib->CommGetAsyncError = LateAsyncError;
    lib->GetErrorString = LateErrorString;
    lib->GetLastError = LateLastError;
    lib->AllGather = LateAllGather;
    lib->Broadcast = LateBroadcast;
    lib->Send = Unused;
    lib->Recv = UnusedRecv;
    lib->GroupStart = NoGroup;
    lib->GroupEnd = NoGroup;
    return lib;
  }();
  return *nccl;
}

NcclOptions OneRank() {
  NcclOptions options;
  options.group_name = "late";
  options.rank = 0;
  options.world_size = 1;
  options.timeout = absl::Seconds(20);
  options.connect_timeout = absl::Seconds(20);
  return options;
}

absl::StatusOr<std::unique_ptr<NcclProcessGroup>> MakeGroup(
    HostRuntimeOptions runtime_options) {
  return NcclProcessGroup::CreateWith(
      OneRank(), LateNccl(),
      [runtime_options]() -> absl::StatusOr<std::unique_ptr<DeviceRuntime>> {
        std::unique_ptr<DeviceRuntime> runtime =
            CreateHostRuntime(runtime_options);
        absl::MutexLock lock(&World().mu);
        World().runtime = runtime.get();
        return runtime;
      });
}

TEST(NcclProcessGroupEnqueueTest, CollectivesEnqueuedLateMoveExactBytes) {
  auto group = MakeGroup({});
  ASSERT_TRUE(group.ok()) << group.status();
  const std::string payload(5000, 'q');
  absl::StatusOr<std::vector<std::string>> all = (*group)->AllGather(payload);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ::testing::ElementsAre(payload));
  absl::StatusOr<std::string> b = (*group)->Broadcast("broadcast bytes", 0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, "broadcast bytes");
  EXPECT_TRUE((*group)->Barrier().ok());
}

// The collective's work is enqueued after the call returned ncclInProgress
// and then never finishes (held on the stream, as a lost peer would hold
// it): the call must end at its deadline with the communicator aborted,
// not return early and block reading the result.
TEST(NcclProcessGroupEnqueueTest, WorkEnqueuedLateIsWaitedForUntilDeadline) {
  absl::Notification held, release, landed;
  HostRuntimeOptions runtime_options;
  runtime_options.copy_observer = [&](const HostCopyTrace& trace) {
    if (trace.kind != CopyKind::kDeviceToDevice) return;
    if (trace.phase == HostCopyTrace::Phase::kStart) {
      held.Notify();
      release.WaitForNotification();
    } else {
      landed.Notify();
    }
  };
  int aborts_before;
  {
    absl::MutexLock lock(&World().mu);
    aborts_before = World().aborts;
  }
  auto group = MakeGroup(runtime_options);
  ASSERT_TRUE(group.ok()) << group.status();
  absl::Status gathered;
  absl::Notification returned;
  std::thread caller([&] {
    // The payload's all-gather copies between two buffers (the sizes' is in
    // place): that copy is held.
    gathered = (*group)->AllGather("payload", absl::Milliseconds(300)).status();
    returned.Notify();
  });
  held.WaitForNotification();
  // Bounds a hang only: the deadline above is what ends the call.
  const bool in_time =
      returned.WaitForNotificationWithTimeout(absl::Seconds(30));
  release.Notify();
  caller.join();
  // The host runtime frees "device" memory at once (cudaFree would wait):
  // the group's buffers must outlive the copy.
  landed.WaitForNotification();
  EXPECT_TRUE(in_time) << "the all-gather did not end at its deadline";
  EXPECT_EQ(gathered.code(), absl::StatusCode::kDeadlineExceeded) << gathered;
  EXPECT_THAT(gathered.message(), HasSubstr("aborted"));
  absl::MutexLock lock(&World().mu);
  EXPECT_EQ(World().aborts, aborts_before + 1);
}

}  // namespace
}  // namespace dcp::comm
