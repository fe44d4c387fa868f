// Internal to io/: how a FileSystemReader reads the stored items of a plan
// (io/fs_read_plan.h) from their data files.
//
// Reads go out in windows of at most `window_bytes` of bounce buffers
// (reads straight into their destination cost none): window w+1 is in
// flight in the I/O engine while window w is verified and delivered on
// `thread_count` threads. A stored item is planned (destinations resolved,
// pieces cut) when the windows reach it, so bounce memory stays bounded
// however large the plan. Each piece (ReadSlot) is read, checked against the
// item's block checksums, copied box by box into its destinations (device
// ones through DeviceStaging), and the item's last piece commits every use.
#ifndef DCP_IO_FS_READ_WINDOW_H_
#define DCP_IO_FS_READ_WINDOW_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/executor.h"
#include "core/future.h"
#include "io/extensions.h"
#include "io/file_system.h"
#include "io/fs_read_plan.h"
#include "io/internal/parallel_work.h"
#include "io/io_engine.h"
#include "planner/planner.h"

namespace dcp::internal_fs {

// Loads through bounce buffers: the most bytes one read of a stored item
// takes (whole checksum blocks; the window size caps it further).
inline constexpr int64_t kReadPieceBytes = int64_t{16} << 20;
// Stored items smaller than this are read through bounce buffers, runs of
// neighbours in one file with one request, never in place one by one.
inline constexpr int64_t kMinInPlaceBytes = int64_t{64} << 10;

// Opens each data file of a directory once and shares it between threads.
// Thread-safe; entries stay valid as long as the OpenFiles.
class OpenFiles {
 public:
  // An open data file and its size when opened.
  struct Entry {
    std::unique_ptr<File> file;
    int64_t size = 0;
  };

  OpenFiles(FileSystemBase& fs, std::string dir, OpenOptions options)
      : fs_(fs), dir_(std::move(dir)), options_(options) {}

  // The open file dir/`relative_path` (opened on the first call); the
  // open's error.
  absl::StatusOr<const Entry*> Get(const std::string& relative_path);

 private:
  FileSystemBase& fs_;
  std::string dir_;
  const OpenOptions options_;
  absl::Mutex mu_;
  // node_hash_map: entries stay where they are while others are added.
  absl::node_hash_map<std::string, Entry> files_ ABSL_GUARDED_BY(mu_);
};

// Checks what the metadata says of the stored item `index` against what
// backs it, before the reader allocates or reads anything for it: the
// checksum block size is one a reader accepts, the item has one checksum
// per block (of its raw bytes, with extensions), its extensions are ones
// `extensions` decodes, and its data file (opened here, through `files`)
// holds its bytes. kDataLoss naming the item and the file otherwise;
// kFailedPrecondition naming the item and the descriptor for an extension
// `extensions` does not know (ExtensionRegistry::Find).
absl::Status CheckStoredItem(const MetadataIndex& index,
                             const StorageInfo& info, int64_t block_size,
                             const ExtensionRegistry& extensions,
                             OpenFiles& files);

// Bounce-buffer bytes held now and at most. Thread-safe.
class BounceMeter {
 public:
  void Add(int64_t bytes);
  void Remove(int64_t bytes) { held_.fetch_sub(bytes); }
  int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<int64_t> held_{0};
  std::atomic<int64_t> peak_{0};
};

// An AlignedBuffer counted by a BounceMeter while it lives.
class BounceBuffer {
 public:
  BounceBuffer(int64_t size, BounceMeter& meter)
      : buffer_(static_cast<size_t>(size)), meter_(meter) {
    meter_.Add(size);
  }
  ~BounceBuffer() { meter_.Remove(buffer_.size); }
  std::byte* data() const { return buffer_.data; }

 private:
  internal_io::AlignedBuffer buffer_;
  BounceMeter& meter_;
};

// A bounce buffer of `size` bytes, or kResourceExhausted naming `what` when
// the memory is not there (a damaged or crafted item's length must not throw
// std::bad_alloc on a reader thread, where nothing would catch it).
absl::StatusOr<std::unique_ptr<BounceBuffer>> NewBounceBuffer(
    int64_t size, BounceMeter& meter, absl::string_view what);

// One read on its way from a data file to the planner: a whole stored item
// read straight into its destination (zero copy), or a piece of one (a run
// of its checksum blocks) read into a bounce buffer, verified, decoded
// (items stored through extensions), and copied out box by box.
struct ReadSlot {
  StoredItem* stored = nullptr;
  File* file = nullptr;
  // The item's checksum blocks [first_block, end_block) (raw bytes
  // [begin, end) of the item, stored as bytes [io_begin, io_end) from its
  // offset: the same without extensions), and for tensors the chunk
  // elements [first_element, end_element) this slot delivers.
  int64_t first_block = 0, end_block = 0;
  int64_t begin = 0, end = 0;
  int64_t io_begin = 0, io_end = 0;
  int64_t first_element = 0, end_element = 0;
  bool zero_copy = false;
  // Where stored byte `io_begin` lands: the destination (zero copy) or
  // `lead` bytes into `buffer` (O_DIRECT reads start at an aligned offset).
  // Once an encoded slot is decoded: where raw byte `begin` is, in
  // `decoded`.
  std::byte* target = nullptr;
  std::unique_ptr<BounceBuffer> decoded;
  // Shared by a run of small slots of one file read with one request
  // (ReadStoredItems coalesces them); `reads` then holds that request's
  // future in each of them.
  std::shared_ptr<BounceBuffer> buffer;
  int64_t lead = 0;
  // Zero copy with O_DIRECT: the aligned body is read in place, the last
  // partial block through `tail`.
  int64_t body = 0;
  std::unique_ptr<BounceBuffer> tail;
  int64_t buffer_bytes = 0;  // What `buffer` will take (window accounting).
  std::vector<IoRequest> requests;
  std::vector<Future<size_t>> reads;
};

// Waits for `slot`'s reads; how many of its bytes arrived (fewer than asked:
// the file is truncated), or the first read's error.
absl::StatusOr<int64_t> AwaitSlot(ReadSlot& slot);

// Checks that `got` is all of `slot`'s bytes and that they match their block
// checksums; kDataLoss naming the item, the file and the offset otherwise.
absl::Status VerifySlot(const ReadSlot& slot, int64_t got, int64_t block_size);

struct ReadWindowOptions {
  // Decodes items stored through extensions; not null.
  const ExtensionRegistry* extensions = &ExtensionRegistry::Default();
  // Data files are asked to open with O_DIRECT. Whether one did is its
  // File::direct() (StoredItem::direct); this is the fallback when the
  // file did not open (its read then fails).
  bool direct = true;
  int64_t block_size = 0;    // Metadata::checksum_block_size.
  int64_t window_bytes = 1;  // Bounce bytes per window (at least one slot).
  int64_t piece_bytes = 1;   // The most bytes one bounce read takes.
  int thread_count = 1;      // Threads verifying and delivering.
};

// Reads every item of `stored` through `engine` and delivers it to
// `planner`: the first error (planner's, I/O's, verification's), after
// waiting for every read in flight. The calling thread submits the windows
// and verifies and delivers with up to thread_count - 1 tasks of `executor`
// (RunWorkers). `device_staging` gives the staging for
// device destinations (called on the first one; its copies are flushed and
// those destinations committed at the end).
absl::Status ReadStoredItems(
    std::vector<StoredItem>& stored, const ReadWindowOptions& options,
    IoEngine& engine, Executor& executor, OpenFiles& files,
    LoadPlanner& planner,
    const std::function<absl::StatusOr<DeviceStaging*>()>& device_staging,
    BounceMeter& meter, const std::string& dir);

}  // namespace dcp::internal_fs

#endif  // DCP_IO_FS_READ_WINDOW_H_
