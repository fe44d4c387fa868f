// FileSystemBase: the small file-system interface the storage layer uses
// (the seed's FileSystemBase), and the local POSIX implementation. Wrappers
// (fault injection, see io/fault_injection.h) forward to another instance.
//
// Errors: every failure is converted from errno once, at the system call,
// with the operation, path and (for I/O) offset and length in the message:
// kNotFound (ENOENT), kPermissionDenied (EACCES, EPERM, EROFS),
// kAlreadyExists (EEXIST), kResourceExhausted (ENOSPC, EDQUOT, EFBIG),
// kDataLoss (EIO) and absl::ErrnoToStatus's mapping for the rest.
//
// Thread safety: FileSystemBase methods are thread-safe. A File may be used
// from several threads at once for positional I/O (PRead/PWrite at disjoint
// ranges); Sync, Close and destruction must not race with other calls.
#ifndef DCP_IO_FILE_SYSTEM_H_
#define DCP_IO_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dcp {

// An open file. The destructor closes it if Close() was not called (and
// drops any close error: call Close() to see it).
class File {
 public:
  virtual ~File() = default;

  // The path the file was opened with (for messages).
  virtual const std::string& path() const = 0;

  // Writes all of `data` at `offset`, retrying short writes and EINTR.
  virtual absl::Status PWrite(int64_t offset,
                              absl::Span<const std::byte> data) = 0;

  // Reads up to `buffer.size()` bytes at `offset`, retrying short reads and
  // EINTR; returns the bytes read, fewer only at end of file.
  virtual absl::StatusOr<size_t> PRead(int64_t offset,
                                       absl::Span<std::byte> buffer) = 0;

  // Makes written data durable (fdatasync-like semantics are not enough for
  // a new file's size, so this is fsync).
  virtual absl::Status Sync() = 0;

  // The current size in bytes.
  virtual absl::StatusOr<int64_t> Size() = 0;

  // Reserves the file's first `size` bytes on disk and makes the file at
  // least that long (fallocate), so that later writes below `size` neither
  // allocate blocks nor extend the file: ext4 runs O_DIRECT writes that do
  // one at a time, under the inode lock. A hint: OK without effect where the
  // file system cannot (EOPNOTSUPP); kResourceExhausted when the space is not
  // there. The default does nothing.
  virtual absl::Status Preallocate(int64_t size) { return absl::OkStatus(); }

  // Starts writing the dirty pages of [offset, offset + length) back to the
  // disk without waiting for them (sync_file_range SYNC_FILE_RANGE_WRITE).
  // Makes nothing durable (Sync does): it keeps the disk busy during a long
  // buffered write instead of leaving everything to the final Sync, and it
  // keeps the dirty pages below the kernel's limit, past which writers are
  // throttled. A hint: OK without effect where the file cannot (a pipe, a
  // file system without it; see WritebackStatus). The default does nothing.
  virtual absl::Status StartWriteback(int64_t offset, int64_t length) {
    return absl::OkStatus();
  }

  // Sets the file's size to `size` bytes (ftruncate).
  virtual absl::Status Truncate(int64_t size) = 0;

  // Closes the file; later calls fail with kFailedPrecondition.
  virtual absl::Status Close() = 0;

  // The operating-system descriptor I/O engines may use directly, or -1 when
  // I/O must go through the virtual methods (a wrapper that injects faults).
  virtual int native_fd() const { return -1; }

  // Whether I/O bypasses the page cache (opened with O_DIRECT and the file
  // system took it): engines size reads by it.
  virtual bool direct() const { return false; }

  // Whether the file's pages leave the page cache once done with
  // (OpenOptions::uncached): writes ask the kernel with RWF_DONTCACHE,
  // reads drop what they have read behind themselves (NoteRead). PRead and
  // PWrite do so themselves; engines that do I/O on native_fd() pass the
  // flag on writes and call NoteRead after reads. False from the start on
  // file systems whose pages are the file (tmpfs, memfd, ramfs, hugetlbfs),
  // and false for good once the kernel refuses the flag on a write
  // (NoteUncachedRefused): the file then uses the page cache as usual.
  virtual bool uncached() const { return false; }

  // Called by an engine after a buffered read on native_fd() of an uncached
  // file copied `length` bytes at `offset` out: the file drops the pages
  // that no read still out can need (io/internal/read_drop_behind.h) from
  // the page cache. Close drops the rest of what was read.
  virtual void NoteRead(int64_t offset, int64_t length) {}

  // Called by an engine whose transfer with RWF_DONTCACHE failed with
  // EOPNOTSUPP (a kernel before 6.14, or a file system without it, such as
  // tmpfs); it retries the transfer without the flag.
  virtual void NoteUncachedRefused() {}
};

struct OpenOptions {
  // Fail with kAlreadyExists when the file exists (O_EXCL); otherwise an
  // existing file is truncated.
  bool exclusive = true;
  // Open with O_DIRECT where the file system supports it (silently buffered
  // where it does not, and on tmpfs, ramfs and hugetlbfs, whose pages are
  // the file). Callers then use 4 KiB aligned buffers and offsets.
  bool direct = false;
  // Reads and writes of a file that is not O_DIRECT go through the page
  // cache but leave it once done: a written page once it is on the disk
  // (RWF_DONTCACHE, Linux 6.14+ on file systems that have it; elsewhere the
  // file uses the cache as usual, see File::uncached), a page read once it
  // and its neighbours have been copied out (POSIX_FADV_DONTNEED behind the
  // reader, in 4 MiB stretches; pages cached before the read go too). Files
  // on tmpfs, ramfs or hugetlbfs are never uncached: their pages are the
  // file, and asking to drop them costs every CPU a drain. The cache
  // then holds only what is in flight: a checkpoint evicts no other file's
  // pages, and its pages are recycled instead of the kernel finding fresh
  // memory for each, which is what slows large buffered saves and loads
  // (docs/BENCHMARKS.md section 1, "Uncached buffered I/O").
  bool uncached = false;
  // Fail (ELOOP: kFailedPrecondition) rather than follow a symbolic link in
  // the last component of the path (O_NOFOLLOW): a checkpoint's data files
  // are its own regular files, not links to files elsewhere.
  bool no_follow = false;
};

// How FileSystemBase::LockDirectory holds a directory: alone, or together
// with other shared holders (which keep exclusive holders out).
enum class LockMode { kExclusive, kShared };

// An advisory lock on a directory (FileSystemBase::LockDirectory), held
// until the object is destroyed.
class DirectoryLock {
 public:
  virtual ~DirectoryLock() = default;
};

class FileSystemBase {
 public:
  virtual ~FileSystemBase() = default;

  // Creates `path` for writing (mode 0644).
  virtual absl::StatusOr<std::unique_ptr<File>> OpenForWrite(
      const std::string& path, const OpenOptions& options = {}) = 0;

  // Opens an existing regular file read-only. Never blocks in the open
  // itself (a FIFO is opened non-blocking, then refused): kFailedPrecondition
  // naming the path when it is not a regular file.
  virtual absl::StatusOr<std::unique_ptr<File>> OpenForRead(
      const std::string& path, const OpenOptions& options = {}) = 0;

  // Atomically replaces `to` with `from` (rename(2)).
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;

  // Removes a file; kNotFound when it does not exist.
  virtual absl::Status RemoveFile(const std::string& path) = 0;

  // Creates `path` and missing parents (mkdir -p), each directory it makes
  // durable in its parent (fsync of the parent); OK if it exists as a
  // directory.
  virtual absl::Status CreateDir(const std::string& path) = 0;

  // Whether `path` exists (any kind of file).
  virtual absl::StatusOr<bool> Exists(const std::string& path) = 0;

  // Whether `path` itself (its last component) is a symbolic link; false
  // when it does not exist, and on file systems without links.
  virtual absl::StatusOr<bool> IsSymbolicLink(const std::string& path) {
    return false;
  }

  // The names (not paths) of the entries of directory `path`, sorted,
  // without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& path) = 0;

  // Makes the entries of directory `path` durable (fsync of the directory).
  virtual absl::Status SyncDir(const std::string& path) = 0;

  // Takes the advisory lock of directory `dir` without waiting, in `mode`:
  // an exclusive holder is alone (a save holds its directory from SetUp to
  // its commit); shared holders (rank-local saves into subdirectories) keep
  // exclusive ones out but not each other. `holder` describes the taker
  // (process, host, save) to whoever finds the lock taken (with shared
  // holders, the latest to describe itself). kFailedPrecondition naming
  // `dir` and the holder's description when the lock is held in a mode
  // that excludes `mode`, in this process or another. The lock goes when
  // the returned object is destroyed or its process dies. The local file
  // system locks `dir`/.lock with flock(2), which holds the description
  // while locked and is removed by the last holder on release (a crashed
  // holder leaves it behind, unlocked); flock reaches other hosts only where
  // the file system forwards it (NFSv4 does; some network file systems do
  // not).
  virtual absl::StatusOr<std::unique_ptr<DirectoryLock>> LockDirectory(
      const std::string& dir, absl::string_view holder, LockMode mode) = 0;
};

// The name of the lock file LockDirectory keeps in a locked directory.
inline constexpr char kDirectoryLockFileName[] = ".lock";

// The payload type URL marking LockDirectory's kFailedPrecondition for a
// lock another holder has (its description as the payload).
inline constexpr char kLockHeldPayload[] = "type.dcp/DirectoryLock.held";

// Whether `status`, from LockDirectory, says another holder has the lock
// (which frees when it lets go), not that the lock cannot be taken at all
// (a lock file that is no regular file, a directory this process may not
// write).
bool IsLockHeld(const absl::Status& status);

// "pid P on host H": this process, as a LockDirectory holder describes
// itself (followed by what it is doing).
std::string ThisProcessDescription();

// The status of a sync_file_range(SYNC_FILE_RANGE_WRITE) that failed with
// `error_number`: OK where the file or its file system cannot start
// writeback (EINVAL, ESPIPE, EOPNOTSUPP, ENOSYS: File::StartWriteback is a
// hint), else the errno status ("sync_file_range PATH offset=O length=L").
// Shared by File and the io_uring engine, which issues it itself.
absl::Status WritebackStatus(int error_number, absl::string_view path,
                             int64_t offset, int64_t length);

// `dir` + "/" + `name` (no doubled slash).
std::string JoinPath(absl::string_view dir, absl::string_view name);

// kFailedPrecondition naming `path` (`what`: "rank 1's rank-local
// directory") when it is a symbolic link; OK otherwise. For the
// subdirectories a checkpoint's layout names (rank-R/, sharded/): a save
// cleans them up and a load reads them, and neither may reach files
// outside the checkpoint through a link a received directory carries.
absl::Status RefuseSymbolicLink(FileSystemBase& fs, const std::string& path,
                                absl::string_view what);

// The empty file a writer creates and removes in a checkpoint directory
// during SetUp to learn, before planning, that the directory takes new
// files: kProbeFilePrefix, the rank, "-", the save id.
inline constexpr char kProbeFilePrefix[] = ".dcp-probe-";
std::string ProbeFileName(int rank, absl::string_view save_id);
// Whether `name` is a probe file's name (any rank or save).
bool IsProbeFileName(absl::string_view name);

// Creates, closes and removes `dir`/ProbeFileName(rank, save_id), calling
// `created` with its path once it exists. The error of the creation is
// annotated "rank R: checkpoint directory DIR is not writable". A probe
// that is gone before its removal is not an error: a coordinator sweeps
// the probes interrupted saves left (they hold no data), and may sweep one
// of the current save's ranks while it is probing.
absl::Status ProbeWritable(
    FileSystemBase& fs, const std::string& dir, int rank,
    absl::string_view save_id,
    absl::FunctionRef<void(const std::string&)> created =
        [](const std::string&) {});

// The kAborted status of a load whose read failed with `status` because
// another save replaced the checkpoint in `dir` (or, `removed`, a removal
// took it) after the load read its metadata: not damage, load again.
absl::Status ReplacedWhileReading(absl::string_view dir,
                                  const absl::Status& status, bool removed);

// Renames `from` (a small file this process wrote, holding `content`) to
// `to`: the step that commits a checkpoint. A rename that reports failure
// but was done (over NFS a retried request finds its source gone and says
// ENOENT) is success when `from` is gone and `to` holds exactly `content`;
// otherwise the rename's error.
absl::Status RenameCommitFile(FileSystemBase& fs, const std::string& from,
                              const std::string& to, absl::string_view content);

// The local POSIX file system (process-wide, stateless).
FileSystemBase& LocalFileSystem();

// A File over an open descriptor that it owns (closes). For I/O engines and
// wrappers that open descriptors themselves. `uncached`: as
// OpenOptions::uncached.
std::unique_ptr<File> NewPosixFile(int fd, std::string path,
                                   bool uncached = false);

// pwritev2's RWF_DONTCACHE (Linux 6.14; Debian 12's headers predate it).
inline constexpr int kRwfDontCache = 0x00000080;

}  // namespace dcp

#endif  // DCP_IO_FILE_SYSTEM_H_
