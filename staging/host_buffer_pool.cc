#include "staging/host_buffer_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"

namespace dcp {
namespace {

constexpr size_t kPage = 4096;

size_t RoundUpToPage(size_t n) {
  if (n == 0) n = 1;
  return (n + kPage - 1) / kPage * kPage;
}

// The spare buffers of HostBufferOptions::recycle, indexed by `shared`.
// Leaked on purpose: buffers may be released during static destruction.
struct SpareBuffers {
  absl::Mutex mu;
  std::unique_ptr<HostBuffer> spare[2] ABSL_GUARDED_BY(mu);
};

SpareBuffers& Spares() {
  static SpareBuffers* spares = new SpareBuffers();
  return *spares;
}

#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;
#endif

// Whether the kernel has MADV_POPULATE_WRITE (Linux 5.14): tried once on a
// page of its own, so that a failure on the caller's range is the range's.
bool KernelPopulatesForWriting() {
  static const bool has = [] {
    void* page = mmap(nullptr, kPage, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return false;
    const bool ok = madvise(page, kPage, MADV_POPULATE_WRITE) == 0;
    munmap(page, kPage);
    return ok;
  }();
  return has;
}

// Faults every page of [data, data + size) in for writing: one
// MADV_POPULATE_WRITE, or a write to each page where the kernel lacks it.
// The memory's contents are unchanged. A range the kernel refuses (not
// mapped, not writable, memory that cannot be had) is an error naming it,
// never a fault.
absl::Status PopulateSlice(std::byte* data, size_t size) {
  if (!KernelPopulatesForWriting()) {
    for (size_t at = 0; at < size; at += kPage) {
      volatile std::byte* p = data + at;
      *p = *p;
    }
    return absl::OkStatus();
  }
  if (madvise(data, size, MADV_POPULATE_WRITE) == 0) return absl::OkStatus();
  const int err = errno;
  return ErrnoError(err,
                    absl::StrFormat("faulting in %d bytes at %p for writing "
                                    "(MADV_POPULATE_WRITE; memory that is not "
                                    "mapped, not writable or not to be had)",
                                    size, static_cast<void*>(data)));
}

}  // namespace

// PopulateSlice over the whole range, in slices of at least 128 MiB on up
// to 8 threads: faulting memory in is per-page kernel work that scales with
// cores (bench/host_buffer_bench, 2 GiB of memfd on 2 cores: 0.55 s vs
// 0.74 s on one thread).
absl::Status PopulateHostMemory(std::byte* data, size_t size) {
  constexpr size_t kSlice = size_t{128} << 20;
  const size_t threads = std::min<size_t>(
      {size / kSlice,
       static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency())),
       8});
  if (threads <= 1) return PopulateSlice(data, size);
  // Slices start on the kernel's pages (64 KiB on some arm64 kernels), as
  // madvise wants; `data` starts on one.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t per = size / threads / page * page;
  std::vector<absl::Status> results(threads);
  std::vector<std::thread> helpers;
  for (size_t i = 1; i < threads; ++i) {
    const size_t begin = i * per;
    const size_t end = i + 1 == threads ? size : begin + per;
    helpers.emplace_back([&results, i, data, begin, end] {
      results[i] = PopulateSlice(data + begin, end - begin);
    });
  }
  results[0] = PopulateSlice(data, per);
  for (std::thread& t : helpers) t.join();
  for (absl::Status& result : results) {
    if (!result.ok()) return result;
  }
  return absl::OkStatus();
}

void ReleaseSpareHostBuffers() {
  std::unique_ptr<HostBuffer> dropped[2];
  absl::MutexLock lock(&Spares().mu);
  for (int i = 0; i < 2; ++i) dropped[i] = std::move(Spares().spare[i]);
}

std::shared_ptr<HostBuffer> HostBuffer::Share(HostBuffer* buffer,
                                              bool recycle) {
  if (!recycle) return std::shared_ptr<HostBuffer>(buffer);
  return std::shared_ptr<HostBuffer>(buffer, [](HostBuffer* b) {
    std::unique_ptr<HostBuffer> older(b);
    if (b->data_ == nullptr) return;  // Creation failed: nothing to keep.
    absl::MutexLock lock(&Spares().mu);
    Spares().spare[b->fd_ >= 0].swap(older);  // Older goes (unmaps) here.
  });
}

absl::StatusOr<std::shared_ptr<HostBuffer>> HostBuffer::Create(
    size_t bytes, DeviceRuntime* runtime, HostBufferOptions options) {
  if (options.pinned && runtime == nullptr) {
    return absl::InvalidArgumentError(
        "HostBuffer: pinned memory needs a DeviceRuntime to register with");
  }
  const bool recycle = options.recycle && !options.pinned;
  if (recycle) {
    const size_t wanted = RoundUpToPage(bytes);
    absl::MutexLock lock(&Spares().mu);
    std::unique_ptr<HostBuffer>& spare = Spares().spare[options.shared];
    if (spare != nullptr && spare->size_ >= wanted &&
        spare->size_ <= 2 * wanted) {
      return Share(spare.release(), /*recycle=*/true);
    }
  }
  std::shared_ptr<HostBuffer> buffer = Share(new HostBuffer(), recycle);
  buffer->size_ = RoundUpToPage(bytes);
  // Populated for writing after the mapping, on several threads, rather
  // than with MAP_POPULATE: MAP_POPULATE faults a shared mapping in for
  // reading only (each page's first write then faults again; the first
  // copy into a fresh memfd buffer ran at 0.4x the speed of later ones),
  // and it faults an anonymous one in on the calling thread alone
  // (bench/host_buffer_bench: 3.3 GB on 2 cores, see docs/BENCHMARKS.md).
  int flags = 0;
  if (options.shared) {
    buffer->fd_ = memfd_create(options.name.c_str(), MFD_CLOEXEC);
    if (buffer->fd_ < 0) {
      return ErrnoError(errno,
                        absl::StrFormat("memfd_create %s", options.name));
    }
    if (ftruncate(buffer->fd_, static_cast<off_t>(buffer->size_)) != 0) {
      return ErrnoError(errno, absl::StrFormat("ftruncate memfd %s to %d bytes",
                                               options.name, buffer->size_));
    }
    flags |= MAP_SHARED;
  } else {
    flags |= MAP_PRIVATE | MAP_ANONYMOUS;
  }
  void* p = mmap(nullptr, buffer->size_, PROT_READ | PROT_WRITE, flags,
                 buffer->fd_, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    const std::string what =
        absl::StrFormat("mmap %d bytes of staging memory%s", buffer->size_,
                        options.shared ? " (memfd)" : "");
    if (err == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%s: out of memory; lower the pool size", what));
    }
    return ErrnoError(err, what);
  }
  buffer->data_ = static_cast<std::byte*>(p);
  if (options.populate) {
    DCP_RETURN_IF_ERROR(
        Annotate(PopulateHostMemory(buffer->data_, buffer->size_),
                 absl::StrFormat("staging memory of %d bytes", buffer->size_)));
  }
  if (options.pinned) {
    DCP_RETURN_IF_ERROR(Annotate(
        runtime->RegisterHost(buffer->data_, buffer->size_),
        absl::StrFormat("pinning %d bytes of staging memory", buffer->size_)));
    buffer->registered_with_ = runtime;
  }
  return buffer;
}

HostBuffer::~HostBuffer() {
  if (registered_with_ != nullptr) {
    registered_with_->UnregisterHost(data_).IgnoreError();
  }
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

namespace internal_pool {

struct PoolState {
  std::shared_ptr<HostBuffer> buffer;
  size_t chunk_bytes = 0;
  int num_chunks = 0;

  absl::Mutex mu;
  std::vector<int> free_list ABSL_GUARDED_BY(mu);  // Stack of chunk indices.
  int in_use ABSL_GUARDED_BY(mu) = 0;
  int peak ABSL_GUARDED_BY(mu) = 0;
  bool shutdown ABSL_GUARDED_BY(mu) = false;

  void Return(int index) {
    absl::MutexLock lock(&mu);
    free_list.push_back(index);
    --in_use;
  }
};

}  // namespace internal_pool

PoolChunk::PoolChunk(PoolChunk&& other) noexcept { *this = std::move(other); }

PoolChunk& PoolChunk::operator=(PoolChunk&& other) noexcept {
  if (this != &other) {
    Release();
    state_ = std::move(other.state_);
    index_ = std::exchange(other.index_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PoolChunk::Release() {
  if (state_ == nullptr) return;
  state_->Return(index_);
  state_.reset();
  index_ = -1;
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<std::unique_ptr<HostBufferPool>> HostBufferPool::Create(
    DeviceRuntime* runtime, HostBufferPoolOptions options) {
  if (options.chunk_bytes == 0 || options.total_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "HostBufferPool: total_bytes=%d and chunk_bytes=%d must "
        "both be positive",
        options.total_bytes, options.chunk_bytes));
  }
  const size_t chunk = RoundUpToPage(options.chunk_bytes);
  if (chunk > options.total_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "HostBufferPool: chunk_bytes=%d (rounded to 4 KiB: %d) exceeds "
        "total_bytes=%d; the pool must hold at least one chunk",
        options.chunk_bytes, chunk, options.total_bytes));
  }
  auto state = std::make_shared<internal_pool::PoolState>();
  state->chunk_bytes = chunk;
  state->num_chunks = static_cast<int>(options.total_bytes / chunk);
  HostBufferOptions buffer_options;
  buffer_options.pinned = options.use_pinned_memory;
  buffer_options.shared = options.use_shared_memory;
  buffer_options.name = "dcp-staging-pool";
  DCP_ASSIGN_OR_RETURN(
      state->buffer,
      HostBuffer::Create(chunk * state->num_chunks, runtime, buffer_options));
  {
    absl::MutexLock lock(&state->mu);
    // Highest index at the bottom: chunks are handed out in index order.
    for (int i = state->num_chunks - 1; i >= 0; --i) {
      state->free_list.push_back(i);
    }
  }
  return std::unique_ptr<HostBufferPool>(new HostBufferPool(std::move(state)));
}

HostBufferPool::HostBufferPool(std::shared_ptr<internal_pool::PoolState> state)
    : state_(std::move(state)) {
  regions_.reserve(state_->num_chunks);
  for (int i = 0; i < state_->num_chunks; ++i) {
    regions_.push_back(iovec{state_->buffer->data() + i * state_->chunk_bytes,
                             state_->chunk_bytes});
  }
}

HostBufferPool::~HostBufferPool() { Shutdown(); }

void HostBufferPool::Shutdown() {
  absl::MutexLock lock(&state_->mu);
  state_->shutdown = true;
}

absl::StatusOr<PoolChunk> HostBufferPool::Acquire() {
  return AcquireImpl(std::nullopt);
}

absl::StatusOr<PoolChunk> HostBufferPool::AcquireWithTimeout(
    absl::Duration timeout) {
  return AcquireImpl(timeout);
}

absl::StatusOr<PoolChunk> HostBufferPool::AcquireImpl(
    std::optional<absl::Duration> timeout) {
  internal_pool::PoolState& s = *state_;
  absl::MutexLock lock(&s.mu);
  auto can_proceed = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    return !s.free_list.empty() || s.shutdown;
  };
  if (timeout.has_value()) {
    if (!s.mu.AwaitWithTimeout(absl::Condition(&can_proceed), *timeout)) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "HostBufferPool: no chunk was returned within %s (%d of %d leased)",
          absl::FormatDuration(*timeout), s.in_use, s.num_chunks));
    }
  } else {
    s.mu.Await(absl::Condition(&can_proceed));
  }
  if (s.shutdown) {
    return absl::CancelledError("HostBufferPool: shut down while acquiring");
  }
  return TakeLocked();
}

PoolChunk HostBufferPool::TakeLocked() {
  internal_pool::PoolState& s = *state_;
  s.mu.AssertHeld();
  const int index = s.free_list.back();
  s.free_list.pop_back();
  ++s.in_use;
  if (s.in_use > s.peak) s.peak = s.in_use;
  return PoolChunk(state_, index, s.buffer->data() + index * s.chunk_bytes,
                   s.chunk_bytes);
}

std::optional<PoolChunk> HostBufferPool::TryAcquire() {
  internal_pool::PoolState& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (s.free_list.empty() || s.shutdown) return std::nullopt;
  return TakeLocked();
}

size_t HostBufferPool::chunk_bytes() const { return state_->chunk_bytes; }
int HostBufferPool::num_chunks() const { return state_->num_chunks; }
bool HostBufferPool::pinned() const { return state_->buffer->pinned(); }
int HostBufferPool::shared_memory_fd() const { return state_->buffer->fd(); }

int HostBufferPool::in_use() const {
  absl::MutexLock lock(&state_->mu);
  return state_->in_use;
}

int HostBufferPool::peak_in_use() const {
  absl::MutexLock lock(&state_->mu);
  return state_->peak;
}

void HostBufferPool::ResetPeak() {
  absl::MutexLock lock(&state_->mu);
  state_->peak = state_->in_use;
}

}  // namespace dcp
