// Copy-on-write snapshots of host memory (Linux userfaultfd write-protect).
//
// TakeCowSnapshot(copies) makes each copy (src -> dst) behave as if it were
// made the moment it returns, though most bytes are copied afterwards: it
// write-protects the sources' pages and returns; one background thread then
// copies them block by block, lifting the protection behind it. A write to a
// protected page before its turn, by any thread of the process or by the
// kernel on its behalf (read(2) into it), waits while a fault-handling thread
// copies that page's block first. So a caller may change its sources as soon
// as TakeCowSnapshot returns; the time it blocks is that of write-protecting
// page tables (~30 ms for 3.3 GB), not of copying the bytes.
//
// What is protected: the whole pages inside a source that lie in private
// anonymous memory of this process (what malloc, numpy and torch's CPU
// allocator hand out). The rest is returned in CowSnapshot::to_copy for the
// caller to copy before it changes its sources: copies under
// min_protected_bytes, the partial first and last page of each source (they
// may hold other data, the allocator's own among it, which the fault handler
// must never wait for), and sources in shared memory (another process could
// write them unseen) or in files.
//
// Contract: the caller keeps the sources mapped (it may change them) and does
// not touch the destinations until `filled` is ready. Writes that bypass the
// page tables are not seen: a device's DMA into page-locked memory
// (cudaHostRegister, RDMA registrations). Never snapshot memory a device
// writes; the Python binding copies pinned tensors instead.
//
// One snapshot is in flight per process: TakeCowSnapshot waits until the
// previous one is filled. Thread-safe.
#ifndef DCP_STAGING_COW_SNAPSHOT_H_
#define DCP_STAGING_COW_SNAPSHOT_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "core/future.h"

namespace dcp {

struct HostCopy {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  size_t bytes = 0;
};

struct CowSnapshotOptions {
  // Copies smaller than this are left to the caller (to_copy): copying them
  // costs less than protecting them.
  size_t min_protected_bytes = size_t{1} << 20;
  // A write to a protected page waits while this many bytes around it (a
  // block, aligned to the start of its protected range) are copied. A
  // multiple of the page size.
  size_t block_bytes = size_t{1} << 20;
  // For tests: the background copy starts only once this is notified, so
  // that writes meet protected pages.
  absl::Notification* hold_background_copy = nullptr;
};

struct CowSnapshotStats {
  size_t protected_bytes = 0;         // Copied after TakeCowSnapshot returned.
  size_t blocks = 0;                  // Blocks those bytes were copied in.
  size_t blocks_copied_on_write = 0;  // Of those, copied for a write.
};

struct CowSnapshot {
  // Copies (or parts of copies) that were not protected: the caller makes
  // them before it changes its sources.
  std::vector<HostCopy> to_copy;
  // Ready when every protected byte is copied and the protection removed.
  Future<CowSnapshotStats> filled;
};

// OK when this process can take copy-on-write snapshots: Linux userfaultfd
// with write-protection of anonymous memory, unpopulated pages included
// (Linux 6.4), and the right to use it (root, CAP_SYS_PTRACE,
// vm.unprivileged_userfaultfd=1 or access to /dev/userfaultfd). Otherwise
// kUnavailable saying what is missing. Probed once. Always kUnavailable in
// ThreadSanitizer builds: it cannot see that a faulting write waits for the
// copy of the bytes it overwrites. TakeCowSnapshot is also kUnavailable in
// a child of fork(2) of the process that probed.
absl::Status CowSnapshotsAvailable();

// Takes a snapshot of `copies` (see the file comment). The sources of
// different copies may overlap; the destinations must not overlap any
// source or each other. Errors: kUnavailable (CowSnapshotsAvailable), the
// caller then copies everything itself; kInvalidArgument for a NULL pointer
// with a non-zero size, or a destination that overlaps a source's protected
// pages.
absl::StatusOr<CowSnapshot> TakeCowSnapshot(
    absl::Span<const HostCopy> copies, const CowSnapshotOptions& options = {});

}  // namespace dcp

#endif  // DCP_STAGING_COW_SNAPSHOT_H_
