// IoEngine: batches of positional writes, reads and fsyncs on open Files,
// each completing through a Future. Two implementations, picked by IoMode in
// NewIoEngine:
//
// - io_uring (liburing, io/uring_engine.cc): one ring per submitting thread.
//   A thread's first Submit binds it to a ring of its own (reused from a
//   thread that has exited, or created, up to `max_rings`; beyond that
//   threads share rings); the thread fills its ring and enters the kernel
//   itself, with up to `queue_depth` I/Os in flight per ring (more wait in
//   the ring's queue). Each ring's reaper thread collects completions,
//   resubmits short transfers and fulfils the futures.
// - POSIX (io/io_engine.cc): pwrite/pread (File::PWrite/PRead, which loop
//   over EINTR and partial transfers) on `threads` worker threads; the
//   buffered writes to one file run one at a time, in order.
//
// Uncached files (File::uncached, OpenOptions::uncached) have their writes
// issued with RWF_DONTCACHE; where the kernel refuses it (EOPNOTSUPP) the
// file turns it off and the transfer is redone without it. Their buffered
// reads are plain; each completed read is reported to the file
// (File::NoteRead), which drops the pages behind the reader.
//
// Ownership: the engine owns neither files nor buffers. Each request's File
// must stay open, and its buffer valid (and, for writes, unchanged), until
// the request's future is ready.
//
// Thread safety: Submit may be called from any number of threads at once.
// Futures complete on engine threads (a ring's reaper, a POSIX worker); keep
// callbacks short. Work submitted from a callback goes to the calling
// reaper's own ring.
//
// Transfers: the engine resubmits short writes and reads for the remainder
// and retries EINTR/EAGAIN. A write completes with its full length or an
// error. A read completes with the bytes read, fewer than asked only at end
// of file (the caller decides whether that means a truncated file).
//
// Ordering: requests run concurrently and complete in any order, except that
// an fsync or a writeback starts only after every write to the same File
// submitted before it (in the same or an earlier batch) has completed. If
// one of those writes failed, it fails too (kAborted) without being issued.
// Later writes do not wait for it.
//
// Writeback (File::StartWriteback, sync_file_range SYNC_FILE_RANGE_WRITE)
// starts writing a range's dirty pages to the disk and completes without
// waiting for them; it makes nothing durable. A hint: OK where the file
// cannot (WritebackStatus); an empty range completes at once, unissued.
//
// Errors: errno converted at the system call with operation, path, offset
// and length in the message (core/status.h ErrnoError: ENOSPC ->
// kResourceExhausted, EIO -> kDataLoss, ...).
#ifndef DCP_IO_IO_ENGINE_H_
#define DCP_IO_IO_ENGINE_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/future.h"
#include "io/file_system.h"

namespace dcp {

struct IoRequest {
  enum class Op { kWrite, kRead, kFsync, kWriteback };

  static IoRequest Write(File* file, int64_t offset, const void* data,
                         size_t length) {
    return {Op::kWrite, file, offset,
            static_cast<std::byte*>(const_cast<void*>(data)), length};
  }
  static IoRequest Read(File* file, int64_t offset, void* data, size_t length) {
    return {Op::kRead, file, offset, static_cast<std::byte*>(data), length};
  }
  static IoRequest Fsync(File* file) {
    return {Op::kFsync, file, 0, nullptr, 0};
  }
  static IoRequest Writeback(File* file, int64_t offset, size_t length) {
    return {Op::kWriteback, file, offset, nullptr, length};
  }

  Op op = Op::kWrite;
  File* file = nullptr;       // Not owned.
  int64_t offset = 0;         // Byte offset in the file.
  std::byte* data = nullptr;  // Not owned; written from or read into.
  size_t length = 0;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // "io_uring" or "posix" (for messages and benchmarks).
  virtual absl::string_view name() const = 0;

  // Starts every request of `batch`; returns one future per request, in
  // order, resolving to the bytes transferred (0 for fsync and writeback).
  virtual std::vector<Future<size_t>> Submit(
      absl::Span<const IoRequest> batch) = 0;

  // Registers long-lived buffers (the staging pool's) so the engine can use
  // them without per-I/O mapping (io_uring fixed buffers). Requests whose
  // data lies inside a registered buffer use it automatically, on every ring
  // (rings created later register it too). Replaces any earlier
  // registration; an empty span unregisters. Waits until each ring has no
  // I/O in flight (submissions meanwhile wait). Returns the kernel's refusal
  // (e.g. kResourceExhausted for RLIMIT_MEMLOCK); I/O stays correct without
  // fixed buffers. Engines without such a facility accept and ignore it.
  virtual absl::Status RegisterBuffers(absl::Span<const iovec> buffers) {
    return absl::OkStatus();
  }
};

// Submits `batch` and waits for all of it: OK, or the first error in batch
// order. `transferred`, when set, receives each request's byte count.
absl::Status SubmitAndWait(IoEngine& engine, absl::Span<const IoRequest> batch,
                           std::vector<size_t>* transferred = nullptr);

enum class IoMode {
  kAuto,   // io_uring if it can be set up, else POSIX (logged once).
  kUring,  // io_uring or an error.
  kPosix,
};

// "auto", "uring", "posix".
absl::StatusOr<IoMode> ParseIoMode(absl::string_view text);
absl::string_view IoModeName(IoMode mode);

// The defaults were chosen by measurement (docs/BENCHMARKS.md section 1,
// "Writeback" for max_transfer and threads, "Buffered read sizes" for
// queue_depth, max_buffered_read and max_buffered_reads_in_flight): the
// smallest values that reach fio's bandwidth.
struct IoEngineOptions {
  IoMode mode = IoMode::kAuto;
  // io_uring: entries per ring, the I/Os in flight per submitting thread.
  int queue_depth = 32;
  // io_uring: the most buffered reads (File::direct() false) in flight per
  // ring, out of queue_depth: more of them look to the kernel's read-ahead
  // like lone reads, not one stream (docs/BENCHMARKS.md section 1,
  // "Buffered read sizes").
  int max_buffered_reads_in_flight = 8;
  // io_uring: the most rings (one per concurrently submitting thread).
  int max_rings = 16;
  // POSIX: worker threads, the I/Os in flight. io_uring: threads serving
  // files without a native descriptor.
  int threads = 8;
  // Largest single transfer: bigger requests are split (keeps many I/Os in
  // flight and bounds each syscall).
  size_t max_transfer = size_t{1} << 20;
  // Largest single read of a file without O_DIRECT (File::direct() false);
  // O_DIRECT reads keep `max_transfer`. 0 means `max_transfer`: 1 MiB parts
  // taken in offset order are read by the kernel as one stream, in large
  // folios; larger parts are read each on their own, a page at a time
  // (docs/BENCHMARKS.md section 1, "Buffered read sizes").
  size_t max_buffered_read = 0;
};

// Creates the engine `options.mode` asks for. kAuto falls back to POSIX when
// io_uring cannot be set up, writing one line to stderr the first time in
// the process. kUring fails with the set-up error (kUnavailable or the errno
// status).
absl::StatusOr<std::unique_ptr<IoEngine>> NewIoEngine(
    const IoEngineOptions& options = {});

// The two implementations, for tests and benchmarks that want one directly.
std::unique_ptr<IoEngine> NewPosixIoEngine(const IoEngineOptions& options);
absl::StatusOr<std::unique_ptr<IoEngine>> NewUringIoEngine(
    const IoEngineOptions& options);

namespace internal_io {
// Test hook: when set, io_uring set-up fails with this errno (simulates a
// container that blocks io_uring). 0 restores normal behaviour.
void SetUringSetupFailureForTest(int error_number);
// Whether NewIoEngine has printed its fallback notice in this process.
bool FallbackNoticePrinted();
// What an io_uring engine has done so far: rings created, I/Os issued on
// registered (fixed) buffers, and the buffered-read high-water mark.
// kInvalidArgument for another engine.
struct UringStats {
  int rings = 0;
  int64_t fixed_ios = 0;
  // The most buffered reads in flight at once on one ring.
  int most_buffered_reads_in_flight = 0;
};
absl::StatusOr<UringStats> UringStatsForTest(IoEngine& engine);
}  // namespace internal_io

}  // namespace dcp

#endif  // DCP_IO_IO_ENGINE_H_
