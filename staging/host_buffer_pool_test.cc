#include "staging/host_buffer_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cuda/host_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

HostBufferPoolOptions SmallPool(size_t total, size_t chunk) {
  HostBufferPoolOptions o;
  o.total_bytes = total;
  o.chunk_bytes = chunk;
  return o;
}

TEST(HostBufferPoolTest, CarvesChunksAndExposesRegions) {
  auto runtime = CreateHostRuntime();
  // 5000 rounds up to 8192: 40000 / 8192 = 4 chunks.
  auto pool = HostBufferPool::Create(runtime.get(), SmallPool(40000, 5000));
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->chunk_bytes(), 8192u);
  EXPECT_EQ((*pool)->num_chunks(), 4);
  EXPECT_EQ((*pool)->total_bytes(), 4u * 8192);
  EXPECT_TRUE((*pool)->pinned());
  EXPECT_EQ((*pool)->shared_memory_fd(), -1);
  absl::Span<const iovec> regions = (*pool)->Regions();
  ASSERT_EQ(regions.size(), 4u);
  for (size_t i = 0; i < regions.size(); ++i) {
    EXPECT_EQ(regions[i].iov_len, 8192u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(regions[i].iov_base) % 4096, 0u);
  }
  std::set<int> seen;
  std::vector<PoolChunk> chunks;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<PoolChunk> c = (*pool)->Acquire();
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->data(), static_cast<std::byte*>(regions[c->index()].iov_base));
    std::memset(c->data(), i, c->size());
    seen.insert(c->index());
    chunks.push_back(*std::move(c));
  }
  EXPECT_EQ(seen.size(), 4u);
  EXPECT_EQ((*pool)->in_use(), 4);
}

TEST(HostBufferPoolTest, RegistersItsMemoryWithTheRuntime) {
  auto runtime = CreateHostRuntime();
  auto pool =
      HostBufferPool::Create(runtime.get(), SmallPool(1 << 16, 1 << 14));
  ASSERT_TRUE(pool.ok());
  void* base = (*pool)->Regions()[0].iov_base;
  // Already registered by the pool.
  EXPECT_EQ(runtime->RegisterHost(base, 4096).code(),
            absl::StatusCode::kAlreadyExists);
  pool->reset();
  // Unregistered when the pool went away.
  EXPECT_EQ(runtime->UnregisterHost(base).code(), absl::StatusCode::kNotFound);
}

TEST(HostBufferPoolTest, BoundedAcquireAndRelease) {
  auto pool = HostBufferPool::Create(nullptr, [] {
    HostBufferPoolOptions o = SmallPool(2 * 4096, 4096);
    o.use_pinned_memory = false;
    return o;
  }());
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_FALSE((*pool)->pinned());
  absl::StatusOr<PoolChunk> a = (*pool)->Acquire();
  absl::StatusOr<PoolChunk> b = (*pool)->Acquire();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE((*pool)->TryAcquire().has_value());
  absl::StatusOr<PoolChunk> timed =
      (*pool)->AcquireWithTimeout(absl::Milliseconds(5));
  EXPECT_EQ(timed.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed.status().message(), HasSubstr("2 of 2 leased"));

  // A blocked Acquire wakes when another thread returns a chunk.
  absl::Notification acquired;
  int got_index = -1;
  std::thread waiter([&] {
    absl::StatusOr<PoolChunk> c = (*pool)->Acquire();
    ASSERT_TRUE(c.ok());
    got_index = c->index();
    acquired.Notify();
  });
  const int released = a->index();
  a->Release();
  EXPECT_FALSE(a->valid());
  waiter.join();
  EXPECT_TRUE(acquired.HasBeenNotified());
  EXPECT_EQ(got_index, released);
  EXPECT_EQ((*pool)->peak_in_use(), 2);
  EXPECT_EQ((*pool)->in_use(), 1);  // b; the waiter's lease died with it.
}

TEST(HostBufferPoolTest, ShutdownCancelsBlockedAcquire) {
  auto pool = HostBufferPool::Create(nullptr, [] {
    HostBufferPoolOptions o = SmallPool(4096, 4096);
    o.use_pinned_memory = false;
    return o;
  }());
  ASSERT_TRUE(pool.ok());
  absl::StatusOr<PoolChunk> only = (*pool)->Acquire();
  ASSERT_TRUE(only.ok());
  absl::Status waiter_status;
  std::thread waiter([&] { waiter_status = (*pool)->Acquire().status(); });
  (*pool)->Shutdown();
  waiter.join();
  EXPECT_EQ(waiter_status.code(), absl::StatusCode::kCancelled);
}

TEST(HostBufferPoolTest, LeaseOutlivesPool) {
  auto runtime = CreateHostRuntime();
  auto pool = HostBufferPool::Create(runtime.get(), SmallPool(8192, 4096));
  ASSERT_TRUE(pool.ok());
  absl::StatusOr<PoolChunk> c = (*pool)->Acquire();
  ASSERT_TRUE(c.ok());
  pool->reset();
  std::memset(c->data(), 0x5a, c->size());  // Memory still mapped.
  c->Release();
}

TEST(HostBufferPoolTest, SharedMemoryIsVisibleThroughTheFd) {
  auto runtime = CreateHostRuntime();
  HostBufferPoolOptions o = SmallPool(4 * 4096, 4096);
  o.use_shared_memory = true;
  auto pool = HostBufferPool::Create(runtime.get(), o);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const int fd = (*pool)->shared_memory_fd();
  ASSERT_GE(fd, 0);
  // Map it as another process would: reopen through /proc, map shared.
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  const int other_fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(other_fd, 0);
  void* view = mmap(nullptr, (*pool)->total_bytes(), PROT_READ | PROT_WRITE,
                    MAP_SHARED, other_fd, 0);
  ASSERT_NE(view, MAP_FAILED);
  absl::StatusOr<PoolChunk> c = (*pool)->Acquire();
  ASSERT_TRUE(c.ok());
  std::memset(c->data(), 0xab, c->size());
  const auto* seen =
      static_cast<const unsigned char*>(view) + c->index() * 4096;
  EXPECT_EQ(seen[0], 0xab);
  EXPECT_EQ(seen[4095], 0xab);
  // And the other way round.
  static_cast<unsigned char*>(view)[c->index() * 4096 + 7] = 0x11;
  EXPECT_EQ(static_cast<unsigned char>(c->data()[7]), 0x11);
  munmap(view, (*pool)->total_bytes());
  close(other_fd);
}

TEST(HostBufferTest, RecycledBufferIsReusedWhenTheSizeFits) {
  ReleaseSpareHostBuffers();
  HostBufferOptions o;
  o.pinned = false;
  o.recycle = true;
  auto first = HostBuffer::Create(1 << 20, nullptr, o);
  ASSERT_TRUE(first.ok()) << first.status();
  std::byte* data = (*first)->data();
  first->reset();  // Parked as the spare, not unmapped.
  auto again = HostBuffer::Create((1 << 20) - 4096, nullptr, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->data(), data);
  again->reset();
  // Far smaller: a new mapping (the spare would waste more than half).
  auto small = HostBuffer::Create(100 << 10, nullptr, o);
  ASSERT_TRUE(small.ok());
  EXPECT_NE((*small)->data(), data);
  // Another kind (shared) never takes an anonymous spare.
  o.shared = true;
  auto shared = HostBuffer::Create(1 << 20, nullptr, o);
  ASSERT_TRUE(shared.ok());
  EXPECT_NE((*shared)->data(), data);
  EXPECT_GE((*shared)->fd(), 0);
  // Without recycle nothing is reused.
  HostBufferOptions plain;
  plain.pinned = false;
  auto fresh = HostBuffer::Create(1 << 20, nullptr, plain);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE((*fresh)->data(), data);
  ReleaseSpareHostBuffers();
}

// A buffer large enough to be populated on several threads, shared or
// not: every page is resident when Create returns (the slices cover the
// whole range, the odd tail included) and reads zero.
TEST(HostBufferTest, LargeBufferIsResidentAndZero) {
  for (bool shared : {false, true}) {
    HostBufferOptions o;
    o.pinned = false;
    o.shared = shared;
    const size_t bytes = (size_t{300} << 20) + 2 * 4096 + 5;
    auto buffer = HostBuffer::Create(bytes, nullptr, o);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    const size_t size = (*buffer)->size();
    ASSERT_EQ(size, (size_t{300} << 20) + 3 * 4096);  // An odd page count.
    std::vector<unsigned char> resident(size / 4096);
    ASSERT_EQ(mincore((*buffer)->data(), size, resident.data()), 0);
    size_t missing = 0;
    for (unsigned char r : resident) missing += (r & 1) == 0;
    EXPECT_EQ(missing, 0u) << "shared " << shared;
    const auto* bytes_of =
        reinterpret_cast<const unsigned char*>((*buffer)->data());
    for (size_t at = 0; at < size; at += size_t{1} << 20) {
      ASSERT_EQ(bytes_of[at], 0) << at << " shared " << shared;
    }
    EXPECT_EQ(bytes_of[size - 1], 0);
  }
}

// Without populate (a copy-on-write stage's buffer, filled off the caller's
// path) nothing is faulted in by Create, shared or not.
TEST(HostBufferTest, UnpopulatedBufferIsNotResident) {
  for (bool shared : {false, true}) {
    HostBufferOptions o;
    o.pinned = false;
    o.shared = shared;
    o.populate = false;
    auto buffer = HostBuffer::Create(size_t{64} << 20, nullptr, o);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    const size_t size = (*buffer)->size();
    std::vector<unsigned char> resident(size / 4096);
    ASSERT_EQ(mincore((*buffer)->data(), size, resident.data()), 0);
    size_t present = 0;
    for (unsigned char r : resident) present += r & 1;
    EXPECT_EQ(present, 0u) << "shared " << shared;
    (*buffer)->data()[size - 1] = std::byte{1};  // Usable all the same.
  }
}

TEST(HostBufferPoolTest, RejectsBadOptions) {
  auto runtime = CreateHostRuntime();
  absl::StatusOr<std::unique_ptr<HostBufferPool>> too_big =
      HostBufferPool::Create(runtime.get(), SmallPool(4096, 8192));
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.status().message(), HasSubstr("chunk_bytes=8192"));
  EXPECT_EQ(
      HostBufferPool::Create(runtime.get(), SmallPool(4096, 0)).status().code(),
      absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<HostBufferPool>> no_runtime =
      HostBufferPool::Create(nullptr, SmallPool(8192, 4096));
  EXPECT_EQ(no_runtime.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_runtime.status().message(), HasSubstr("DeviceRuntime"));
}

}  // namespace
}  // namespace dcp
