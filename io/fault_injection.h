// FaultInjectionFileSystem: a FileSystemBase wrapper that forwards every call
// to another file system except the faults a test scripts (after leveldb's
// EnvWrapper and rocksdb's FaultInjectionTestFS):
//
// - failure of a chosen operation by call count and/or path (Inject);
// - seeded 1-in-N failures of any operation (FailOneIn);
// - ENOSPC once N bytes have been written (FailWritesAfter);
// - short writes (a Fault with short_write: half the bytes land, then the
//   error);
// - crash simulation (SimulateCrash): drop every byte and directory entry
//   that was not made durable by fsync / directory fsync.
//
// Files it returns have no native descriptor (File::native_fd() is -1), so
// I/O engines route their I/O through the wrapper's methods and every fault
// reaches them too. File::Preallocate and File::StartWriteback are fault
// sites (kPreallocate, kWriteback); File::Truncate is forwarded without one.
//
// Thread safety: all methods are thread-safe.
#ifndef DCP_IO_FAULT_INJECTION_H_
#define DCP_IO_FAULT_INJECTION_H_

#include <cerrno>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"

namespace dcp {

enum class FaultOp {
  kAny,  // Matches every operation below (for "fail the k-th call").
  kOpen,
  kWrite,
  kRead,
  kSync,
  kClose,
  kRename,
  kUnlink,
  kMkdir,
  kSyncDir,
  kList,
  kPreallocate,  // File::Preallocate (fallocate).
  kWriteback,    // File::StartWriteback (sync_file_range).
};

// "open", "write", ... for messages.
const char* FaultOpName(FaultOp op);

struct Fault {
  FaultOp op = FaultOp::kAny;
  int error = EIO;            // errno the failing call reports.
  std::string path_contains;  // Only paths containing this; "" for any.
  // Fail the nth matching call (1-based), counted from when the fault was
  // injected; 0 fails every matching call.
  int64_t nth = 1;
  // kWrite only: the whole 4 KiB blocks of the first half of the bytes are
  // written before the error.
  bool short_write = false;
  // A crash at this call: once it has failed, every later call of any
  // operation (those above) on any path fails with `error` too: the
  // process does no more I/O. Close still releases the descriptor. Follow
  // with SimulateCrash.
  bool crash = false;
  // kRename only: the rename is done, then reported failed with `error`
  // (an NFS reply lost after the server renamed).
  bool after = false;
};

class FaultInjectionFileSystem final : public FileSystemBase {
 public:
  // `base` must outlive this wrapper.
  explicit FaultInjectionFileSystem(FileSystemBase& base);
  ~FaultInjectionFileSystem() override;

  void Inject(Fault fault);
  // Fails each operation with probability 1/n, drawn from `seed`.
  void FailOneIn(int64_t n, uint64_t seed, int error = EIO);
  // Writes fail with `error` once `bytes` bytes have been written in total
  // (the write that crosses the limit lands the whole 4 KiB blocks below the
  // limit, then fails).
  void FailWritesAfter(int64_t bytes, int error = ENOSPC);
  // Removes every fault (the crash bookkeeping stays).
  void ClearFaults();

  // Calls of `op` so far (kAny: all calls).
  int64_t calls(FaultOp op) const;
  // Files opened through this wrapper and not yet closed or destroyed.
  int open_files() const;

  // Simulates a power loss: every file written through this wrapper loses
  // the bytes beyond its size at its last Sync (all of them if never
  // synced); files created since the last SyncDir of their directory
  // disappear; renames since then are undone (the replaced file comes
  // back). Then forgets the bookkeeping: the directory is as a reboot finds
  // it. Call with no file open for writing.
  void SimulateCrash();

  absl::StatusOr<std::unique_ptr<File>> OpenForWrite(
      const std::string& path, const OpenOptions& options) override;
  absl::StatusOr<std::unique_ptr<File>> OpenForRead(
      const std::string& path, const OpenOptions& options) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::StatusOr<bool> Exists(const std::string& path) override;
  absl::StatusOr<bool> IsSymbolicLink(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  // Forwarded without a fault site.
  absl::StatusOr<std::unique_ptr<DirectoryLock>> LockDirectory(
      const std::string& dir, absl::string_view holder, LockMode mode) override;

 private:
  class FaultyFile;
  struct Decision {
    bool fail = false;
    bool short_write = false;
    int error = 0;
    bool after = false;  // Fault::after.
  };
  // Counts a call and decides whether it fails.
  Decision Check(FaultOp op, const std::string& path);
  absl::Status Failure(const Decision& d, FaultOp op, const std::string& what);
  // Write budget: how many of `length` bytes may be written (ENOSPC rule).
  int64_t ClaimWriteBytes(int64_t length, int* error);
  void NoteSynced(const std::string& path, int64_t size);
  void NoteClosed();

  FileSystemBase& base_;
  mutable absl::Mutex mu_;
  struct Armed {
    Fault fault;
    int64_t seen = 0;
    bool fired = false;  // Its nth call has failed.
  };
  std::vector<Armed> faults_ ABSL_GUARDED_BY(mu_);
  int64_t one_in_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rng_ ABSL_GUARDED_BY(mu_) = 0;
  int one_in_error_ ABSL_GUARDED_BY(mu_) = EIO;
  int64_t write_budget_ ABSL_GUARDED_BY(mu_) = -1;
  int write_budget_error_ ABSL_GUARDED_BY(mu_) = ENOSPC;
  std::map<FaultOp, int64_t> calls_ ABSL_GUARDED_BY(mu_);
  int open_files_ ABSL_GUARDED_BY(mu_) = 0;
  // Crash bookkeeping.
  std::map<std::string, int64_t> synced_size_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> unsynced_creates_ ABSL_GUARDED_BY(mu_);
  struct PendingRename {
    std::string from, to;
    bool replaced = false;
    std::string replaced_bytes;
  };
  std::vector<PendingRename> unsynced_renames_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcp

#endif  // DCP_IO_FAULT_INJECTION_H_
