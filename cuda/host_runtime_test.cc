#include "cuda/host_runtime.h"

#include <cstring>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

std::vector<unsigned char> Pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<unsigned char>(i * 31 + seed);
  return v;
}

// Holds back the copy into one destination until Open() is called.
class CopyGate {
 public:
  void Hold(const void* dst) {
    absl::MutexLock lock(&mu_);
    held_dst_ = dst;
  }
  void Open() { open_.Notify(); }
  // Blocks until the held copy has reached the gate.
  void AwaitArrived() { arrived_.WaitForNotification(); }

  void Observe(const HostCopyTrace& trace) {
    if (trace.phase != HostCopyTrace::Phase::kStart) return;
    {
      absl::MutexLock lock(&mu_);
      if (trace.dst != held_dst_) return;
    }
    arrived_.Notify();
    open_.WaitForNotification();
  }

 private:
  absl::Mutex mu_;
  const void* held_dst_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Notification arrived_;
  absl::Notification open_;
};

class HostRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostRuntimeOptions options;
    options.copy_observer = [this](const HostCopyTrace& t) {
      gate_.Observe(t);
    };
    runtime_ = CreateHostRuntime(std::move(options));
  }

  void* Device(size_t n) {
    absl::StatusOr<void*> p = runtime_->AllocateDevice(0, n);
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  }

  CopyGate gate_;
  std::unique_ptr<DeviceRuntime> runtime_;
};

TEST_F(HostRuntimeTest, ReportsOnePretendDevice) {
  EXPECT_TRUE(runtime_->is_host());
  EXPECT_EQ(runtime_->name(), "host");
  EXPECT_EQ(runtime_->DeviceCount(), 1);
  absl::StatusOr<DeviceProperties> props = runtime_->GetDeviceProperties(0);
  ASSERT_TRUE(props.ok()) << props.status();
  EXPECT_TRUE(props->is_host_emulation);
  EXPECT_GT(props->total_memory, 0u);
  absl::StatusOr<DeviceProperties> bad = runtime_->GetDeviceProperties(1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("device 1"));
}

TEST_F(HostRuntimeTest, CopiesRoundTripByteExact) {
  for (size_t n :
       {size_t{1}, size_t{4095}, size_t{4096}, size_t{1 << 20} + 7}) {
    const std::vector<unsigned char> src = Pattern(n, static_cast<unsigned>(n));
    void* d1 = Device(n);
    void* d2 = Device(n);
    std::vector<unsigned char> back(n, 0);
    auto stream = MakeOwnedStream(*runtime_, 0);
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE(runtime_
                    ->CopyAsync(d1, src.data(), n, CopyKind::kHostToDevice,
                                stream->get())
                    .ok());
    ASSERT_TRUE(
        runtime_->CopyAsync(d2, d1, n, CopyKind::kDeviceToDevice, stream->get())
            .ok());
    ASSERT_TRUE(runtime_
                    ->CopyAsync(back.data(), d2, n, CopyKind::kDeviceToHost,
                                stream->get())
                    .ok());
    ASSERT_TRUE(runtime_->SynchronizeStream(stream->get()).ok());
    EXPECT_EQ(back, src) << n;
    std::vector<unsigned char> sync_back(n, 0);
    ASSERT_TRUE(
        runtime_->Copy(sync_back.data(), d1, n, CopyKind::kDeviceToHost).ok());
    EXPECT_EQ(sync_back, src);
    EXPECT_TRUE(runtime_->FreeDevice(d1).ok());
    EXPECT_TRUE(runtime_->FreeDevice(d2).ok());
  }
}

TEST_F(HostRuntimeTest, OneStreamRunsInEnqueueOrder) {
  // a -> b is held at the gate; b -> c is enqueued after it and must see the
  // bytes of a, not b's old contents.
  const size_t n = 64 * 1024;
  const std::vector<unsigned char> a = Pattern(n, 1);
  void* b = Device(n);
  std::vector<unsigned char> c(n, 0);
  gate_.Hold(b);
  auto stream = MakeOwnedStream(*runtime_, 0);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(
      runtime_
          ->CopyAsync(b, a.data(), n, CopyKind::kHostToDevice, stream->get())
          .ok());
  ASSERT_TRUE(
      runtime_
          ->CopyAsync(c.data(), b, n, CopyKind::kDeviceToHost, stream->get())
          .ok());
  gate_.AwaitArrived();
  // Both copies are enqueued; the second cannot have run yet.
  EXPECT_EQ(c, std::vector<unsigned char>(n, 0));
  gate_.Open();
  ASSERT_TRUE(runtime_->SynchronizeStream(stream->get()).ok());
  EXPECT_EQ(c, a);
}

TEST_F(HostRuntimeTest, EventCompletesWhenStreamReachesIt) {
  const size_t n = 4096;
  const std::vector<unsigned char> a = Pattern(n, 2);
  void* b = Device(n);
  auto stream = MakeOwnedStream(*runtime_, 0);
  auto event = MakeOwnedEvent(*runtime_, 0, /*enable_timing=*/true);
  auto start = MakeOwnedEvent(*runtime_, 0, /*enable_timing=*/true);
  ASSERT_TRUE(stream.ok() && event.ok() && start.ok());

  // Never recorded: complete.
  absl::StatusOr<bool> fresh = runtime_->QueryEvent(event->get());
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(*fresh);

  gate_.Hold(b);
  ASSERT_TRUE(runtime_->RecordEvent(start->get(), stream->get()).ok());
  ASSERT_TRUE(
      runtime_
          ->CopyAsync(b, a.data(), n, CopyKind::kHostToDevice, stream->get())
          .ok());
  ASSERT_TRUE(runtime_->RecordEvent(event->get(), stream->get()).ok());
  gate_.AwaitArrived();
  absl::StatusOr<bool> pending = runtime_->QueryEvent(event->get());
  ASSERT_TRUE(pending.ok());
  EXPECT_FALSE(*pending);
  EXPECT_EQ(runtime_->ElapsedMillis(start->get(), event->get()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  gate_.Open();
  ASSERT_TRUE(runtime_->SynchronizeEvent(event->get()).ok());
  absl::StatusOr<bool> done = runtime_->QueryEvent(event->get());
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_EQ(std::memcmp(b, a.data(), n), 0);
  absl::StatusOr<double> ms =
      runtime_->ElapsedMillis(start->get(), event->get());
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0);
}

TEST_F(HostRuntimeTest, ElapsedNeedsTimingEvents) {
  auto stream = MakeOwnedStream(*runtime_, 0);
  auto a = MakeOwnedEvent(*runtime_, 0, /*enable_timing=*/false);
  auto b = MakeOwnedEvent(*runtime_, 0, /*enable_timing=*/false);
  ASSERT_TRUE(stream.ok() && a.ok() && b.ok());
  ASSERT_TRUE(runtime_->RecordEvent(a->get(), stream->get()).ok());
  ASSERT_TRUE(runtime_->RecordEvent(b->get(), stream->get()).ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(stream->get()).ok());
  absl::StatusOr<double> ms = runtime_->ElapsedMillis(a->get(), b->get());
  EXPECT_EQ(ms.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(ms.status().message(), HasSubstr("timing"));
}

TEST_F(HostRuntimeTest, StreamsAreIndependent) {
  const size_t n = 8192;
  const std::vector<unsigned char> a = Pattern(n, 3);
  void* held = Device(n);
  void* free_dst = Device(n);
  auto s1 = MakeOwnedStream(*runtime_, 0);
  auto s2 = MakeOwnedStream(*runtime_, 0);
  ASSERT_TRUE(s1.ok() && s2.ok());
  gate_.Hold(held);
  ASSERT_TRUE(
      runtime_->CopyAsync(held, a.data(), n, CopyKind::kHostToDevice, s1->get())
          .ok());
  gate_.AwaitArrived();
  // s1 is stuck at the gate; s2 still makes progress.
  ASSERT_TRUE(
      runtime_
          ->CopyAsync(free_dst, a.data(), n, CopyKind::kHostToDevice, s2->get())
          .ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(s2->get()).ok());
  EXPECT_EQ(std::memcmp(free_dst, a.data(), n), 0);
  gate_.Open();
  ASSERT_TRUE(runtime_->SynchronizeStream(s1->get()).ok());
  EXPECT_EQ(std::memcmp(held, a.data(), n), 0);
}

TEST_F(HostRuntimeTest, StreamWaitEventOrdersAcrossStreams) {
  const size_t n = 8192;
  const std::vector<unsigned char> a = Pattern(n, 4);
  void* mid = Device(n);
  std::vector<unsigned char> out(n, 0);
  auto s1 = MakeOwnedStream(*runtime_, 0);
  auto s2 = MakeOwnedStream(*runtime_, 0);
  auto ev = MakeOwnedEvent(*runtime_, 0, false);
  ASSERT_TRUE(s1.ok() && s2.ok() && ev.ok());
  gate_.Hold(mid);
  ASSERT_TRUE(
      runtime_->CopyAsync(mid, a.data(), n, CopyKind::kHostToDevice, s1->get())
          .ok());
  ASSERT_TRUE(runtime_->RecordEvent(ev->get(), s1->get()).ok());
  ASSERT_TRUE(runtime_->StreamWaitEvent(s2->get(), ev->get()).ok());
  ASSERT_TRUE(
      runtime_
          ->CopyAsync(out.data(), mid, n, CopyKind::kDeviceToHost, s2->get())
          .ok());
  gate_.AwaitArrived();
  gate_.Open();
  ASSERT_TRUE(runtime_->SynchronizeStream(s2->get()).ok());
  EXPECT_EQ(out, a);
}

TEST_F(HostRuntimeTest, RejectsHostPointerAsDeviceMemory) {
  std::vector<unsigned char> host(64), other(64);
  auto stream = MakeOwnedStream(*runtime_, 0);
  ASSERT_TRUE(stream.ok());
  absl::Status s = runtime_->CopyAsync(other.data(), host.data(), 64,
                                       CopyKind::kDeviceToHost, stream->get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("D2H"));
  EXPECT_THAT(s.message(), HasSubstr("not device memory"));

  void* dev = Device(64);
  s = runtime_->Copy(dev, host.data(), 65, CopyKind::kHostToDevice);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = runtime_->Copy(dev, host.data(), 64, CopyKind::kHostToHost);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("copy kind says host"));
}

TEST_F(HostRuntimeTest, UnknownHandlesAndDevicesAreInvalidArgument) {
  int dummy = 0;
  auto* bogus_stream = reinterpret_cast<DeviceStream*>(&dummy);
  auto* bogus_event = reinterpret_cast<DeviceEvent*>(&dummy);
  EXPECT_EQ(runtime_->SynchronizeStream(bogus_stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->QueryEvent(bogus_event).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->CreateStream(3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(runtime_->DestroyStream(nullptr).ok());
  EXPECT_TRUE(runtime_->DestroyEvent(nullptr).ok());
}

TEST_F(HostRuntimeTest, FindAllocationGivesTheBlockOfAnInteriorPointer) {
  absl::StatusOr<void*> a = runtime_->AllocateDevice(0, 10000);
  absl::StatusOr<void*> b = runtime_->AllocateDevice(0, 100);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::byte* base = static_cast<const std::byte*>(*a);
  absl::StatusOr<DeviceAllocation> found =
      runtime_->FindAllocation(0, base + 9999);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->base, base);
  EXPECT_EQ(found->size, 10000u);
  // One past the end is not in the allocation.
  EXPECT_NE(runtime_->FindAllocation(0, base + 10000)
                .value_or(DeviceAllocation{})
                .base,
            base);
  std::vector<char> host(16);
  EXPECT_EQ(runtime_->FindAllocation(0, host.data()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(runtime_->FindAllocation(1, base).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(runtime_->FreeDevice(*a).ok());
  EXPECT_EQ(runtime_->FindAllocation(0, base).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(runtime_->FreeDevice(*b).ok());
}

TEST_F(HostRuntimeTest, PinnedAndRegisteredMemory) {
  absl::StatusOr<void*> pinned = runtime_->AllocatePinned(10000);
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*pinned) % 4096, 0u);
  std::memset(*pinned, 7, 10000);
  EXPECT_TRUE(runtime_->FreePinned(*pinned).ok());

  std::vector<unsigned char> buf(1 << 16);
  ASSERT_TRUE(runtime_->RegisterHost(buf.data(), buf.size()).ok());
  absl::Status again = runtime_->RegisterHost(buf.data() + 100, 100);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.message(), HasSubstr("RegisterHost"));
  EXPECT_TRUE(runtime_->UnregisterHost(buf.data()).ok());
  absl::Status missing = runtime_->UnregisterHost(buf.data());
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("UnregisterHost"));
}

TEST(HostRuntimeLimitTest, DeviceMemoryLimitIsResourceExhausted) {
  HostRuntimeOptions options;
  options.device_memory_limit = 1 << 20;
  auto runtime = CreateHostRuntime(options);
  absl::StatusOr<void*> a = runtime->AllocateDevice(0, 768 << 10);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<void*> b = runtime->AllocateDevice(0, 512 << 10);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("AllocateDevice"));
  ASSERT_TRUE(runtime->FreeDevice(*a).ok());
  absl::StatusOr<void*> c = runtime->AllocateDevice(0, 512 << 10);
  EXPECT_TRUE(c.ok());
}

TEST(HostRuntimeFaultTest, FailedCopyIsStickyOnItsStream) {
  HostRuntimeOptions options;
  options.copy_fault = [](const HostCopyTrace& t) {
    return t.bytes == 13 ? absl::DataLossError("injected D2H fault")
                         : absl::OkStatus();
  };
  auto runtime = CreateHostRuntime(options);
  void* dev = *runtime->AllocateDevice(0, 4096);
  std::vector<unsigned char> out(4096, 0);
  auto stream = MakeOwnedStream(*runtime, 0);
  auto other = MakeOwnedStream(*runtime, 0);
  auto ev = MakeOwnedEvent(*runtime, 0, false);
  ASSERT_TRUE(stream.ok() && other.ok() && ev.ok());
  ASSERT_TRUE(runtime
                  ->CopyAsync(out.data(), dev, 13, CopyKind::kDeviceToHost,
                              stream->get())
                  .ok());
  ASSERT_TRUE(runtime->RecordEvent(ev->get(), stream->get()).ok());
  absl::Status s = runtime->SynchronizeEvent(ev->get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("injected"));
  EXPECT_EQ(runtime->QueryEvent(ev->get()).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(runtime->SynchronizeStream(stream->get()).code(),
            absl::StatusCode::kDataLoss);
  // Other streams are unaffected.
  ASSERT_TRUE(runtime
                  ->CopyAsync(out.data(), dev, 64, CopyKind::kDeviceToHost,
                              other->get())
                  .ok());
  EXPECT_TRUE(runtime->SynchronizeStream(other->get()).ok());
}

// The wait observer sees a stream about to block on an event another stream
// has not reached (which stream waits, which recorded), and nothing for an
// event already reached.
TEST(HostRuntimeWaitTest, ObserverSeesOnlyWaitsThatBlock) {
  CopyGate gate;
  absl::Mutex mu;
  std::vector<HostWaitTrace> waits;
  HostRuntimeOptions options;
  options.copy_observer = [&](const HostCopyTrace& t) { gate.Observe(t); };
  options.wait_observer = [&](const HostWaitTrace& t) {
    {
      absl::MutexLock lock(&mu);
      waits.push_back(t);
    }
    gate.Open();  // The held copy may run now that the wait is in place.
  };
  auto runtime = CreateHostRuntime(options);
  const size_t n = 4096;
  const std::vector<unsigned char> a = Pattern(n, 5);
  void* dev = *runtime->AllocateDevice(0, n);
  auto s1 = MakeOwnedStream(*runtime, 0);
  auto s2 = MakeOwnedStream(*runtime, 0);
  auto ev = MakeOwnedEvent(*runtime, 0, false);
  ASSERT_TRUE(s1.ok() && s2.ok() && ev.ok());
  gate.Hold(dev);
  ASSERT_TRUE(
      runtime->CopyAsync(dev, a.data(), n, CopyKind::kHostToDevice, s1->get())
          .ok());
  ASSERT_TRUE(runtime->RecordEvent(ev->get(), s1->get()).ok());
  ASSERT_TRUE(runtime->StreamWaitEvent(s2->get(), ev->get()).ok());
  ASSERT_TRUE(runtime->SynchronizeStream(s2->get()).ok());
  EXPECT_EQ(std::memcmp(dev, a.data(), n), 0);
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(waits.size(), 1u);
    EXPECT_EQ(waits[0].stream, s2->get());
    EXPECT_EQ(waits[0].recorder, s1->get());
  }
  // Reached already: no call.
  ASSERT_TRUE(runtime->StreamWaitEvent(s2->get(), ev->get()).ok());
  ASSERT_TRUE(runtime->SynchronizeStream(s2->get()).ok());
  absl::MutexLock lock(&mu);
  EXPECT_EQ(waits.size(), 1u);
}

TEST(HostRuntimeLifetimeTest, DestroyingRuntimeDrainsPendingWork) {
  std::vector<unsigned char> src = Pattern(1 << 20, 5);
  std::vector<unsigned char> dst(1 << 20, 0);
  {
    auto runtime = CreateHostRuntime();
    DeviceStream* stream = *runtime->CreateStream(0);
    DeviceEvent* event = *runtime->CreateEvent(0, false);
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(runtime
                      ->CopyAsync(dst.data(), src.data(), dst.size(),
                                  CopyKind::kHostToHost, stream)
                      .ok());
    }
    ASSERT_TRUE(runtime->RecordEvent(event, stream).ok());
    // Leaked on purpose: the runtime cleans up.
  }
  EXPECT_EQ(dst, src);
}

// Native handles on the host runtime are its own handles, and its one
// pretend device is the current device.
TEST(HostRuntimeNativeTest, NativeStreamIsTheHandleAndDeviceZeroIsCurrent) {
  std::unique_ptr<DeviceRuntime> rt = CreateHostRuntime();
  auto stream = MakeOwnedStream(*rt, 0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(rt->NativeStream(stream->get()), stream->get());
  EXPECT_EQ(rt->SetCurrentDevice(0).value_or(-1), 0);
  EXPECT_EQ(rt->SetCurrentDevice(1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp
