// Host staging memory: HostBuffer (one mapping, optionally pinned and
// optionally in shared memory) and HostBufferPool (a bounded set of equal
// chunks carved from one HostBuffer, leased and returned, reused across saves).
//
// How the memory is obtained, and why: mmap (anonymous, or a memfd when
// shared memory is asked for), populated for writing with
// MADV_POPULATE_WRITE on up to 8 threads, then page-locked with
// DeviceRuntime::RegisterHost (cudaHostRegister). Not cudaHostAlloc, because:
//   * the same path gives shared memory (a memfd another process can map,
//     e.g. a background writer process), which cudaHostAlloc cannot;
//   * every page is faulted in once, at creation, not during the first
//     save;
//   * the mapping is ordinary memory that io_uring can register as fixed
//     buffers (Regions()) and that works without any GPU (the host runtime's
//     RegisterHost is bookkeeping only).
//
// Thread safety: all methods are thread-safe. A PoolChunk keeps the pool's
// memory alive, so a lease may outlive the HostBufferPool object.
#ifndef DCP_STAGING_HOST_BUFFER_POOL_H_
#define DCP_STAGING_HOST_BUFFER_POOL_H_

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cuda/device_runtime.h"

namespace dcp {

struct HostBufferOptions {
  // Page-lock the mapping with the DeviceRuntime (required for truly
  // asynchronous device-to-host copies on CUDA).
  bool pinned = true;
  // Back the mapping with a memfd so another process can map it (fd()).
  bool shared = false;
  // The memfd's name (shows in /proc/<pid>/fd and /proc/<pid>/maps).
  std::string name = "dcp-staging";
  // Unpinned buffers only: when the last reference goes, keep the mapping
  // as the process's spare (one per `shared` kind, the most recent) instead
  // of unmapping it, and let the next Create with recycle take it when it is
  // large enough and at most twice the size asked for. Mapping and faulting
  // in fresh memory costs about 3x a memcpy of it, so a stager created per
  // save (async_save's default) would otherwise pay that on every save.
  // The spare's old contents are not cleared.
  bool recycle = false;
  // Fault every page in (for writing) before Create returns. Off: pages
  // are faulted in by their first write, off the caller's path when that
  // write is (a copy-on-write snapshot's background copy). Pinned buffers
  // are always populated (page-locking faults them in).
  bool populate = true;
};

// Faults every page of [data, data + size) in for writing, on up to 8
// threads (slices of at least 128 MiB), as HostBuffer::Create does: what
// the first write into fresh memory would otherwise pay page by page, on
// one thread. The contents are unchanged. For memory mapped elsewhere (a
// binding's shared-memory segment). A range the kernel will not fault in
// for writing (not mapped, read-only, memory not to be had) is an error
// naming it (absl's code for the errno: kResourceExhausted for ENOMEM),
// never a fault; on a kernel before Linux 5.14 (no MADV_POPULATE_WRITE)
// each page is read and written back instead, which such a range faults.
absl::Status PopulateHostMemory(std::byte* data, size_t size);

// Unmaps the spare buffers kept by HostBufferOptions::recycle.
void ReleaseSpareHostBuffers();

// One mapping of host memory. Move-only through shared_ptr: staged tensors
// hold it as their owner, so it lives as long as any staged tensor does.
class HostBuffer {
 public:
  // Maps `bytes` (rounded up to 4 KiB; at least one page). `runtime` may be
  // null only when options.pinned is false. kInvalidArgument for a null
  // runtime with pinned, kResourceExhausted when memory cannot be had, the
  // runtime's error when registration fails.
  static absl::StatusOr<std::shared_ptr<HostBuffer>> Create(
      size_t bytes, DeviceRuntime* runtime, HostBufferOptions options = {});

  // Unregisters from the runtime (which must still be alive), unmaps, closes
  // the memfd.
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  bool pinned() const { return registered_with_ != nullptr; }
  // The memfd (owned by this object) or -1 when not shared. Another process
  // maps it with mmap(MAP_SHARED) after receiving it (SCM_RIGHTS, or
  // /proc/<pid>/fd/<fd>).
  int fd() const { return fd_; }

 private:
  HostBuffer() = default;
  // Owns `buffer`; with `recycle` the last reference parks it as the spare.
  static std::shared_ptr<HostBuffer> Share(HostBuffer* buffer, bool recycle);

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
  DeviceRuntime* registered_with_ = nullptr;
};

struct HostBufferPoolOptions {
  // Upper bound on the pool's memory. The pool holds
  // total_bytes / chunk_bytes chunks (at least one).
  size_t total_bytes = size_t{256} << 20;
  // Bytes per chunk, rounded up to 4 KiB. 8 MiB keeps a PCIe Gen5 copy
  // engine near its peak per cudaMemcpyAsync while leaving 32 chunks in a
  // 256 MiB pool for copy-ahead.
  size_t chunk_bytes = size_t{8} << 20;
  bool use_pinned_memory = true;
  bool use_shared_memory = false;
};

namespace internal_pool {
struct PoolState;
}  // namespace internal_pool

// A lease on one pool chunk; returns it to the pool when destroyed or
// Release()d. Move-only.
class PoolChunk {
 public:
  PoolChunk() = default;
  PoolChunk(PoolChunk&& other) noexcept;
  PoolChunk& operator=(PoolChunk&& other) noexcept;
  ~PoolChunk() { Release(); }

  bool valid() const { return state_ != nullptr; }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }  // The pool's chunk_bytes.
  absl::Span<std::byte> span() const { return {data_, size_}; }
  // Position in HostBufferPool::Regions(): the io_uring fixed-buffer index.
  int index() const { return index_; }

  // Returns the chunk to the pool now (idempotent).
  void Release();

 private:
  friend class HostBufferPool;
  PoolChunk(std::shared_ptr<internal_pool::PoolState> state, int index,
            std::byte* data, size_t size)
      : state_(std::move(state)), index_(index), data_(data), size_(size) {}

  std::shared_ptr<internal_pool::PoolState> state_;
  int index_ = -1;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// A bounded pool of equal chunks of one HostBuffer. The memory is
// page-locked only when HostBufferPoolOptions::use_pinned_memory is set
// (pinned() says so), and then only as far as the runtime's RegisterHost
// locks it: on the host-memory runtime it stays ordinary memory.
class HostBufferPool {
 public:
  // Allocates the whole pool once. kInvalidArgument for chunk_bytes == 0 or
  // chunk_bytes > total_bytes, or pinned memory without a runtime.
  static absl::StatusOr<std::unique_ptr<HostBufferPool>> Create(
      DeviceRuntime* runtime, HostBufferPoolOptions options = {});

  // Wakes blocked Acquire calls with kCancelled. Outstanding leases stay
  // valid (they keep the memory alive).
  ~HostBufferPool();

  // Blocks until a chunk is free. kCancelled once Shutdown() was called.
  absl::StatusOr<PoolChunk> Acquire();
  // As Acquire, but kDeadlineExceeded after `timeout`.
  absl::StatusOr<PoolChunk> AcquireWithTimeout(absl::Duration timeout);
  // A free chunk, or nullopt when all are leased.
  std::optional<PoolChunk> TryAcquire();
  // Makes current and future Acquire calls return kCancelled.
  void Shutdown();

  size_t chunk_bytes() const;
  int num_chunks() const;
  size_t total_bytes() const { return chunk_bytes() * num_chunks(); }
  bool pinned() const;
  // The memfd of the pool when use_shared_memory, else -1.
  int shared_memory_fd() const;

  // Chunks leased now, and the most ever leased at once since creation or
  // ResetPeak(). Never more than num_chunks(): that is the memory bound.
  int in_use() const;
  int peak_in_use() const;
  void ResetPeak();

  // One iovec per chunk, in index order (PoolChunk::index()), for
  // io_uring_register_buffers. Valid as long as the pool lives.
  absl::Span<const iovec> Regions() const { return regions_; }

 private:
  explicit HostBufferPool(std::shared_ptr<internal_pool::PoolState> state);
  absl::StatusOr<PoolChunk> AcquireImpl(std::optional<absl::Duration>);
  // Takes the top of the free list; the pool's mutex is held.
  PoolChunk TakeLocked();

  std::shared_ptr<internal_pool::PoolState> state_;
  std::vector<iovec> regions_;
};

}  // namespace dcp

#endif  // DCP_STAGING_HOST_BUFFER_POOL_H_
