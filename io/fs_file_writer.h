// Internal to io/: writes one data file of a FileSystemWriter save.
//
// WriteDataFile resolves the file's items, lays them out (io/fs_layout.h),
// preallocates (O_DIRECT only), submits every write through the I/O engine
// (FileWriteQueue: writeback pacing for buffered files, aligned bounce
// buffers for O_DIRECT), checksums host items while their writes are in
// flight, streams device tensors through pinned staging chunks, cuts
// reserved space past the end, fsyncs, and closes. It returns once nothing
// it submitted is in flight.
#ifndef DCP_IO_FS_FILE_WRITER_H_
#define DCP_IO_FS_FILE_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/future.h"
#include "io/extensions.h"
#include "io/file_system.h"
#include "io/internal/parallel_work.h"
#include "io/io_engine.h"
#include "planner/planner.h"

namespace dcp {
class DeviceStaging;  // staging/device_staging.h
}

namespace dcp::internal_fs {

// O_DIRECT writes of unaligned memory: bounce chunk size and the most bounce
// bytes in flight per file.
inline constexpr int64_t kBounceChunk = int64_t{4} << 20;
inline constexpr int64_t kBounceBudget = int64_t{32} << 20;
inline constexpr int64_t kMinBounceCapacity = int64_t{64} << 10;
// Buffered saves: writebacks outstanding per file before the writer waits
// for the oldest (docs/BENCHMARKS.md section 1, "Writeback").
inline constexpr size_t kWritebacksAhead = 2;

// The writes of one open file, in flight in an I/O engine. Every write is
// tracked with the item it belongs to; the first failure is sticky
// (failed()) and Finish reports it naming the item.
//
// Writeback pacing (writeback_bytes > 0, for buffered files with
// sync_files): writes are cut at multiples of writeback_bytes past the last
// writeback; each time writeback_bytes more are submitted a writeback of
// them follows (the engine starts it after their writes complete), and with
// more than kWritebacksAhead writebacks outstanding the caller waits for the
// oldest. The file then goes to the disk at the disk's pace with a few
// pieces of dirty pages, instead of filling the page cache until the
// kernel throttles the writer.
//
// Bounce buffers (TakeBounce): their capacities are the size asked for (at
// least kMinBounceCapacity) rounded up to an eighth of the next power of
// two, and at most kBounceBudget bytes of them are held.
// A buffer whose write completed is reused for the next one of its capacity
// (a save of many small items packs them through the same few, already
// touched, buffers instead of faulting in fresh memory for each pack);
// taking one past the budget first waits for the oldest writes.
//
// Thread safety: one thread drives a queue; the engine completes its
// futures on its own threads. The destructor waits for everything in
// flight, so buffers the queue owns outlive their writes.
class FileWriteQueue {
 public:
  FileWriteQueue(IoEngine& engine, File& file, int64_t writeback_bytes);
  ~FileWriteQueue();
  FileWriteQueue(const FileWriteQueue&) = delete;
  FileWriteQueue& operator=(const FileWriteQueue&) = delete;

  // Submits a write of `length` bytes at `data` to `offset`, for item
  // `item`. The memory must stay valid and unchanged until the returned
  // future is ready (every piece written).
  Future<void> Write(size_t item, int64_t offset, const std::byte* data,
                     size_t length);
  // An uninitialised aligned buffer of at least `size` bytes owned by the
  // queue, kept until the future given to SetBounceWritten for it is ready
  // (the caller sets it once the buffer's write is submitted).
  internal_io::AlignedBuffer* TakeBounce(int64_t size);
  void SetBounceWritten(Future<void> written);
  // Whether any write failed so far.
  bool failed() const { return failed_->load(); }
  // Waits for every write submitted so far.
  void WaitForWrites();
  // Submits an fsync of the file (after every write submitted before it).
  void Fsync();
  // Waits for everything in flight: OK, or the first failure in submission
  // order annotated with "rank R: writing <describe(item)>" ("rank R" for an
  // fsync).
  absl::Status Finish(int rank,
                      absl::FunctionRef<std::string(size_t item)> describe);

 private:
  void Track(size_t item, Future<size_t> f);

  IoEngine& engine_;
  File& file_;
  const int64_t writeback_bytes_;
  int64_t written_back_ = 0;  // Bytes below it were handed to writeback.
  std::deque<Future<size_t>> writebacks_;  // Issued, not yet seen complete.
  struct Bounce {
    std::unique_ptr<internal_io::AlignedBuffer> buffer;
    Future<void> written;
  };
  std::deque<Bounce> bounce_;  // In flight, oldest first.
  // Written and free for reuse.
  std::vector<std::unique_ptr<internal_io::AlignedBuffer>> spare_;
  int64_t bounce_bytes_ = 0;  // Capacity of bounce_ and spare_.
  std::vector<Future<size_t>> futures_;
  std::vector<size_t> future_item_;  // SIZE_MAX: an fsync.
  std::shared_ptr<std::atomic<bool>> failed_;
};

// What WriteDataFile needs of its writer.
struct DataFileContext {
  FileSystemBase* fs = nullptr;
  IoEngine* engine = nullptr;
  std::string dir;
  int rank = 0;
  bool direct_io = true;
  // Lay the file out as a safetensors file (SerializationFormat::
  // kSafetensors): requires direct_io false and no extensions.
  bool safetensors = false;
  bool uncached_writes = true;
  bool sync_files = true;
  int64_t writeback_bytes = 0;
  int64_t checksum_block_size = 0;
  // Applied to host tensors larger than kPackItemBytes (io/
  // fs_encoded_writer.h); empty: every item is stored as it is.
  ExtensionChain extensions;
  // Device tensors are copied only after it.
  DeviceWait device_wait;
  // The staging for device tensors (created on first use); thread-safe.
  std::function<absl::StatusOr<DeviceStaging*>()> staging;
  // Called with the path of the file once it is created; thread-safe.
  std::function<void(const std::string&)> record_created;
};

// Writes `items` into the new data file dir/`relative_path` and fills
// `results` (one per item, same order): each item's offset, length and block
// checksums, and for items stored through context.extensions their
// extension records. Errors name the rank and, for a failed write, the item;
// the file is left for the caller's Abort to remove.
absl::Status WriteDataFile(const DataFileContext& context,
                           const std::string& relative_path,
                           const std::vector<const WriteItem*>& items,
                           SavePlanner& planner,
                           const std::vector<WriteResult*>& results);

}  // namespace dcp::internal_fs

#endif  // DCP_IO_FS_FILE_WRITER_H_
