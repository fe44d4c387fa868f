#include "io/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "io/internal/read_drop_behind.h"

namespace dcp {
namespace {

// The descriptors of the directory locks this process holds. A child of
// fork(2) shares each lock's open file description, which would keep the
// directory locked while the child lives even after this process died
// without releasing it: the child closes its copies at once (its close
// leaves the parent's lock in place). Lock-free slots, so the child, in
// which only the forking thread runs, never waits for a lock.
constexpr int kHeldLockSlots = 64;
std::atomic<int> held_lock_fds[kHeldLockSlots];

void CloseInheritedLocks() {
  for (std::atomic<int>& slot : held_lock_fds) {
    const int fd = slot.exchange(-1);
    if (fd >= 0) ::close(fd);
  }
}

// The slot that now holds `fd`, or -1 when all are taken (the lock then
// stays in fork children: a limit of this registry, not of the lock).
int RegisterHeldLock(int fd) {
  static std::once_flag once;
  std::call_once(once, [] {
    for (std::atomic<int>& slot : held_lock_fds) slot.store(-1);
    ::pthread_atfork(nullptr, nullptr, CloseInheritedLocks);
  });
  for (int i = 0; i < kHeldLockSlots; ++i) {
    int expected = -1;
    if (held_lock_fds[i].compare_exchange_strong(expected, fd)) return i;
  }
  return -1;
}

void UnregisterHeldLock(int slot) {
  if (slot >= 0) held_lock_fds[slot].store(-1);
}

// Whether `fd` is on a file system whose page cache is the file itself
// (tmpfs and memfd, ramfs, hugetlbfs): nothing can leave it. Dropping
// pages behind a reader there frees nothing and costs the most: each
// POSIX_FADV_DONTNEED finds every page pinned and drains the LRU caches of
// all CPUs (lru_add_drain_all), serialising every reader of the process.
bool KeepsPagesInMemory(int fd) {
  constexpr long kTmpfsMagic = 0x01021994;
  constexpr long kRamfsMagic = 0x858458f6;
  constexpr long kHugetlbfsMagic = 0x958458f6;
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0) return false;
  const long type = static_cast<long>(fs.f_type);
  return type == kTmpfsMagic || type == kRamfsMagic || type == kHugetlbfsMagic;
}

class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path, bool uncached)
      : fd_(fd),
        path_(std::move(path)),
        direct_((::fcntl(fd, F_GETFL) & O_DIRECT) != 0),
        uncached_(uncached && !direct_ && !KeepsPagesInMemory(fd)) {}
  ~PosixFile() override {
    if (fd_ < 0) return;
    if (uncached()) Drop(drop_behind_.Rest());
    ::close(fd_);
  }

  const std::string& path() const override { return path_; }
  int native_fd() const override { return fd_; }
  bool direct() const override { return direct_; }
  bool uncached() const override {
    return uncached_.load(std::memory_order_relaxed);
  }
  void NoteUncachedRefused() override {
    uncached_.store(false, std::memory_order_relaxed);
  }

  absl::Status PWrite(int64_t offset,
                      absl::Span<const std::byte> data) override {
    DCP_RETURN_IF_ERROR(CheckOpen("pwrite"));
    size_t done = 0;
    while (done < data.size()) {
      const bool uncached = this->uncached();
      iovec piece{const_cast<std::byte*>(data.data() + done),
                  data.size() - done};
      ssize_t n = ::pwritev2(fd_, &piece, 1, static_cast<off_t>(offset + done),
                             uncached ? kRwfDontCache : 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EOPNOTSUPP && uncached) {
          NoteUncachedRefused();
          continue;
        }
        return ErrnoError(
            errno, absl::StrCat("pwrite ", path_, " offset=", offset + done,
                                " length=", data.size() - done));
      }
      if (n == 0) {
        return ErrnoError(EIO, absl::StrCat("pwrite ", path_, " offset=",
                                            offset + done, " wrote 0 bytes"));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> PRead(int64_t offset,
                               absl::Span<std::byte> buffer) override {
    DCP_RETURN_IF_ERROR(CheckOpen("pread"));
    size_t done = 0;
    while (done < buffer.size()) {
      iovec piece{buffer.data() + done, buffer.size() - done};
      ssize_t n = ::preadv(fd_, &piece, 1, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(
            errno, absl::StrCat("pread ", path_, " offset=", offset + done,
                                " length=", buffer.size() - done));
      }
      if (n == 0) break;  // End of file.
      done += static_cast<size_t>(n);
    }
    NoteRead(offset, static_cast<int64_t>(done));
    return done;
  }

  void NoteRead(int64_t offset, int64_t length) override {
    if (!uncached() || fd_ < 0) return;
    Drop(drop_behind_.Done(offset, length));
  }

  absl::Status Sync() override {
    DCP_RETURN_IF_ERROR(CheckOpen("fsync"));
    while (::fsync(fd_) != 0) {
      if (errno != EINTR)
        return ErrnoError(errno, absl::StrCat("fsync ", path_));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Size() override {
    DCP_RETURN_IF_ERROR(CheckOpen("fstat"));
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      return ErrnoError(errno, absl::StrCat("fstat ", path_));
    }
    return static_cast<int64_t>(st.st_size);
  }

  absl::Status Preallocate(int64_t size) override {
    DCP_RETURN_IF_ERROR(CheckOpen("fallocate"));
    if (size <= 0) return absl::OkStatus();
    while (::fallocate(fd_, 0, 0, static_cast<off_t>(size)) != 0) {
      if (errno == EINTR) continue;
      if (errno == EOPNOTSUPP || errno == ENOSYS) return absl::OkStatus();
      return ErrnoError(errno,
                        absl::StrCat("fallocate ", path_, " length=", size));
    }
    return absl::OkStatus();
  }

  absl::Status StartWriteback(int64_t offset, int64_t length) override {
    DCP_RETURN_IF_ERROR(CheckOpen("sync_file_range"));
    if (length <= 0) return absl::OkStatus();
    while (::sync_file_range(fd_, static_cast<off_t>(offset),
                             static_cast<off_t>(length),
                             SYNC_FILE_RANGE_WRITE) != 0) {
      if (errno != EINTR) {
        return WritebackStatus(errno, path_, offset, length);
      }
    }
    return absl::OkStatus();
  }

  absl::Status Truncate(int64_t size) override {
    DCP_RETURN_IF_ERROR(CheckOpen("ftruncate"));
    while (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      if (errno != EINTR) {
        return ErrnoError(errno,
                          absl::StrCat("ftruncate ", path_, " length=", size));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Close() override {
    DCP_RETURN_IF_ERROR(CheckOpen("close"));
    if (uncached()) Drop(drop_behind_.Rest());
    int fd = std::exchange(fd_, -1);
    // Linux closes the descriptor even when close() fails; never retry.
    if (::close(fd) != 0 && errno != EINTR) {
      return ErrnoError(errno, absl::StrCat("close ", path_));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status CheckOpen(absl::string_view op) const {
    if (fd_ >= 0) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(op, " ", path_, ": the file is closed"));
  }

  // Advice only: a failure leaves the pages cached, which is harmless, and
  // the kernel drops only clean pages, so no data can be lost.
  void Drop(const ReadDropBehind::Ranges& ranges) const {
    for (const auto& [begin, end] : ranges) {
      ::posix_fadvise(fd_, begin, end - begin, POSIX_FADV_DONTNEED);
    }
  }

  int fd_;
  std::string path_;
  bool direct_;
  std::atomic<bool> uncached_;
  ReadDropBehind drop_behind_;
};

// open(2) with O_DIRECT where asked and supported, buffered elsewhere:
// where the file system refuses it (EINVAL), and on file systems whose
// pages are the file (KeepsPagesInMemory: tmpfs takes O_DIRECT since Linux
// 6.6). There O_DIRECT saves no copy, and io_uring hands such reads, which
// cannot be tried without blocking, to one kernel worker at a time, while
// buffered reads go to its workers concurrently (docs/BENCHMARKS.md
// section 9, "O_DIRECT on tmpfs").
int OpenRetryingEintr(const std::string& path, int flags, bool direct) {
  int fd;
  if (direct) {
    do {
      fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0 && KeepsPagesInMemory(fd)) {
      const int status = ::fcntl(fd, F_GETFL);
      if (status == -1 || ::fcntl(fd, F_SETFL, status & ~O_DIRECT) != 0) {
        const int error = errno;
        ::close(fd);
        errno = error;
        return -1;
      }
    }
    if (fd >= 0 || errno != EINVAL) return fd;
  }
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

class LocalFileSystemImpl final : public FileSystemBase {
 public:
  absl::StatusOr<std::unique_ptr<File>> OpenForWrite(
      const std::string& path, const OpenOptions& options) override {
    int flags = O_WRONLY | O_CREAT | (options.exclusive ? O_EXCL : O_TRUNC);
    int fd = OpenRetryingEintr(path, flags, options.direct);
    if (fd < 0) {
      return ErrnoError(errno, absl::StrCat("open for write ", path));
    }
    return NewPosixFile(fd, path, options.uncached);
  }

  absl::StatusOr<std::unique_ptr<File>> OpenForRead(
      const std::string& path, const OpenOptions& options) override {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
    // writer. It changes nothing for regular files and is cleared below.
    const int flags =
        O_RDONLY | O_NONBLOCK | (options.no_follow ? O_NOFOLLOW : 0);
    int fd = OpenRetryingEintr(path, flags, options.direct);
    if (fd < 0) {
      if (errno == ELOOP && options.no_follow) {
        return absl::FailedPreconditionError(
            absl::StrCat("open for read ", path,
                         ": a symbolic link, which is not followed"));
      }
      return ErrnoError(errno, absl::StrCat("open for read ", path));
    }
    DCP_RETURN_IF_ERROR(CheckRegular(fd, absl::StrCat("open for read ", path)));
    if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
      const int error = errno;
      ::close(fd);
      return ErrnoError(error, absl::StrCat("fcntl ", path));
    }
    return NewPosixFile(fd, path, options.uncached);
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoError(errno, absl::StrCat("rename ", from, " to ", to));
    }
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) {
      return ErrnoError(errno, absl::StrCat("unlink ", path));
    }
    return absl::OkStatus();
  }

  absl::Status CreateDir(const std::string& path) override {
    if (path.empty()) return absl::InvalidArgumentError("mkdir: empty path");
    // Create parents first, left to right; each directory made here is made
    // durable in its parent (a checkpoint's directory must survive a power
    // loss as its files do).
    std::vector<size_t> ends;
    for (size_t pos = path.find('/', 1); pos != std::string::npos;
         pos = path.find('/', pos + 1)) {
      ends.push_back(pos);
    }
    ends.push_back(path.size());
    for (size_t end : ends) {
      const std::string dir = path.substr(0, end);
      DCP_ASSIGN_OR_RETURN(bool created, MakeOneDir(dir));
      if (!created) continue;
      const size_t slash = dir.rfind('/');
      const std::string parent = slash == std::string::npos ? "."
                                 : slash == 0               ? "/"
                                              : dir.substr(0, slash);
      DCP_RETURN_IF_ERROR(SyncDir(parent));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Exists(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoError(errno, absl::StrCat("stat ", path));
  }

  absl::StatusOr<bool> IsSymbolicLink(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) return S_ISLNK(st.st_mode);
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoError(errno, absl::StrCat("lstat ", path));
  }

  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr)
      return ErrnoError(errno, absl::StrCat("opendir ", path));
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* entry = ::readdir(dir)) {
      absl::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    int error = errno;
    ::closedir(dir);
    if (error != 0) return ErrnoError(error, absl::StrCat("readdir ", path));
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status SyncDir(const std::string& path) override {
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoError(errno, absl::StrCat("open directory ", path));
    absl::Status status;
    while (::fsync(fd) != 0) {
      if (errno != EINTR) {
        status = ErrnoError(errno, absl::StrCat("fsync directory ", path));
        break;
      }
    }
    ::close(fd);
    return status;
  }

  absl::StatusOr<std::unique_ptr<DirectoryLock>> LockDirectory(
      const std::string& dir, absl::string_view holder,
      LockMode mode) override {
    const bool shared = mode == LockMode::kShared;
    const std::string path = JoinPath(dir, kDirectoryLockFileName);
    int busy_tries = 0;
    while (true) {
      int fd;
      do {
        fd = ::open(path.c_str(),
                    O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                    0644);
      } while (fd < 0 && errno == EINTR);
      if (fd < 0) {
        return ErrnoError(errno, absl::StrCat("open lock file ", path));
      }
      DCP_RETURN_IF_ERROR(
          CheckRegular(fd, absl::StrCat("open lock file ", path)));
      int locked;
      do {
        locked = ::flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB);
      } while (locked != 0 && errno == EINTR);
      if (locked != 0) {
        const int error = errno;
        if (error != EWOULDBLOCK) {
          ::close(fd);
          return ErrnoError(error, absl::StrCat("flock ", path));
        }
        // The last shared holder removes the file holding it exclusively
        // for a moment: a shared taker that finds it so starts over once
        // the name leads elsewhere, and tries again a few times while it
        // still leads here.
        if (shared) {
          struct stat opened, named;
          const bool moved =
              ::fstat(fd, &opened) != 0 || ::stat(path.c_str(), &named) != 0 ||
              named.st_dev != opened.st_dev || named.st_ino != opened.st_ino;
          if (moved || ++busy_tries < kSharedLockTries) {
            ::close(fd);
            if (!moved) absl::SleepFor(absl::Milliseconds(1));
            continue;
          }
        }
        std::string held(1024, '\0');
        const ssize_t n = ::pread(fd, held.data(), held.size(), 0);
        held.resize(n > 0 ? static_cast<size_t>(n) : 0);
        ::close(fd);
        while (!held.empty() && held.back() == '\n') held.pop_back();
        absl::Status status = absl::FailedPreconditionError(absl::StrCat(
            "directory ", dir, " is locked by ",
            held.empty() ? "a holder that has not described itself yet" : held,
            " (", path,
            "); saves into one directory must not overlap: wait for that "
            "save to finish or save elsewhere"));
        status.SetPayload(kLockHeldPayload, absl::Cord(held));
        return status;
      }
      // The holder before us removes the file before releasing it: if the
      // name no longer leads to what we locked, start over.
      struct stat locked_file, named_file;
      if (::fstat(fd, &locked_file) != 0) {
        const int error = errno;
        ::close(fd);
        return ErrnoError(error, absl::StrCat("fstat ", path));
      }
      if (::stat(path.c_str(), &named_file) != 0 ||
          named_file.st_dev != locked_file.st_dev ||
          named_file.st_ino != locked_file.st_ino) {
        ::close(fd);
        continue;
      }
      auto lock = std::make_unique<FlockDirectoryLock>(fd, path, shared);
      const std::string description = absl::StrCat(holder, "\n");
      if (::ftruncate(fd, 0) != 0 ||
          ::pwrite(fd, description.data(), description.size(), 0) !=
              static_cast<ssize_t>(description.size())) {
        return ErrnoError(errno, absl::StrCat("write lock file ", path));
      }
      return lock;
    }
  }

 private:
  // How often a shared LockDirectory tries a lock held exclusively, 1 ms
  // apart, before it reports the holder.
  static constexpr int kSharedLockTries = 50;

  // An flock(2) on `path` through `fd`. Destruction removes the file while
  // holding the lock exclusively, then releases it: a shared holder first
  // tries to turn its lock exclusive, which only the last holder achieves
  // (Linux drops the shared lock before trying, so of holders releasing
  // together the last to try gets it); the others leave the file.
  // Only the process that took it releases it: in a fork child the
  // descriptor was closed at the fork (RegisterHeldLock) and may name
  // another file by now.
  class FlockDirectoryLock final : public DirectoryLock {
   public:
    FlockDirectoryLock(int fd, std::string path, bool shared)
        : fd_(fd),
          path_(std::move(path)),
          shared_(shared),
          owner_(::getpid()),
          slot_(RegisterHeldLock(fd)) {}
    ~FlockDirectoryLock() override {
      if (::getpid() != owner_) return;
      UnregisterHeldLock(slot_);
      bool alone = !shared_;
      if (shared_) {
        int rc;
        do {
          rc = ::flock(fd_, LOCK_EX | LOCK_NB);
        } while (rc != 0 && errno == EINTR);
        alone = rc == 0;
      }
      if (alone) ::unlink(path_.c_str());
      ::close(fd_);
    }

   private:
    const int fd_;
    const std::string path_;
    const bool shared_;
    const pid_t owner_;
    const int slot_;
  };

  // OK when `fd` is a regular file; otherwise closes it and fails with
  // kFailedPrecondition ("`what`: not a regular file").
  static absl::Status CheckRegular(int fd, absl::string_view what) {
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int error = errno;
      ::close(fd);
      return ErrnoError(error, what);
    }
    if (S_ISREG(st.st_mode)) return absl::OkStatus();
    ::close(fd);
    const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                                              : "not a regular file";
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", kind, ", not a regular file"));
  }

  // Whether it made `path` (false: it was a directory already).
  static absl::StatusOr<bool> MakeOneDir(const std::string& path) {
    if (::mkdir(path.c_str(), 0755) == 0) return true;
    const int error = errno;
    // An existing directory is fine whatever mkdir said (a read-only parent
    // may report EROFS or EACCES before EEXIST).
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return false;
      return absl::FailedPreconditionError(
          absl::StrCat("mkdir ", path, ": exists and is not a directory"));
    }
    return ErrnoError(error, absl::StrCat("mkdir ", path));
  }
};

}  // namespace

absl::Status WritebackStatus(int error_number, absl::string_view path,
                             int64_t offset, int64_t length) {
  switch (error_number) {
    case EINVAL:
    case ESPIPE:
    case EOPNOTSUPP:
    case ENOSYS:
      return absl::OkStatus();
    default:
      return ErrnoError(error_number,
                        absl::StrCat("sync_file_range ", path,
                                     " offset=", offset, " length=", length));
  }
}

bool IsLockHeld(const absl::Status& status) {
  return status.GetPayload(kLockHeldPayload).has_value();
}

std::string ThisProcessDescription() {
  char host[256] = "unknown host";
  ::gethostname(host, sizeof(host) - 1);
  host[sizeof(host) - 1] = '\0';
  return absl::StrCat("pid ", ::getpid(), " on host ", host);
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::Status RefuseSymbolicLink(FileSystemBase& fs, const std::string& path,
                                absl::string_view what) {
  DCP_ASSIGN_OR_RETURN(bool link, fs.IsSymbolicLink(path));
  if (!link) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      path, " (", what,
      ") is a symbolic link, which dcp does not follow: it could reach files "
      "outside the checkpoint; replace it with a directory"));
}

std::string ProbeFileName(int rank, absl::string_view save_id) {
  return absl::StrCat(kProbeFilePrefix, rank, "-", save_id);
}

bool IsProbeFileName(absl::string_view name) {
  return absl::StartsWith(name, kProbeFilePrefix);
}

absl::Status ReplacedWhileReading(absl::string_view dir,
                                  const absl::Status& status, bool removed) {
  return absl::AbortedError(
      absl::StrCat("the checkpoint in ", dir,
                   removed ? " was removed" : " was replaced by another save",
                   " while this load read it (", status.message(),
                   "); the destination holds parts of it: load again",
                   removed ? "" : " (the new one is whole)"));
}

absl::Status RenameCommitFile(FileSystemBase& fs, const std::string& from,
                              const std::string& to,
                              absl::string_view content) {
  absl::Status renamed = fs.Rename(from, to);
  if (renamed.ok()) return renamed;
  absl::StatusOr<bool> source_there = fs.Exists(from);
  if (!source_there.ok() || *source_there) return renamed;
  absl::StatusOr<std::unique_ptr<File>> file = fs.OpenForRead(to);
  if (!file.ok()) return renamed;
  absl::StatusOr<int64_t> size = (*file)->Size();
  if (!size.ok() || *size != static_cast<int64_t>(content.size())) {
    return renamed;
  }
  std::string bytes(content.size(), '\0');
  absl::StatusOr<size_t> got = (*file)->PRead(
      0, {reinterpret_cast<std::byte*>(bytes.data()), bytes.size()});
  (*file)->Close().IgnoreError();
  if (!got.ok() || *got != bytes.size() || bytes != content) return renamed;
  return absl::OkStatus();  // Done, though reported failed.
}

absl::Status ProbeWritable(
    FileSystemBase& fs, const std::string& dir, int rank,
    absl::string_view save_id,
    absl::FunctionRef<void(const std::string&)> created) {
  const std::string probe = JoinPath(dir, ProbeFileName(rank, save_id));
  absl::StatusOr<std::unique_ptr<File>> file = fs.OpenForWrite(probe);
  if (!file.ok()) {
    return Annotate(file.status(),
                    absl::StrCat("rank ", rank, ": checkpoint directory ", dir,
                                 " is not writable"));
  }
  created(probe);
  absl::Status closed = (*file)->Close();
  absl::Status removed = fs.RemoveFile(probe);
  DCP_RETURN_IF_ERROR(closed);
  if (absl::IsNotFound(removed)) return absl::OkStatus();
  return removed;
}

FileSystemBase& LocalFileSystem() {
  static LocalFileSystemImpl* const fs = new LocalFileSystemImpl();
  return *fs;
}

std::unique_ptr<File> NewPosixFile(int fd, std::string path, bool uncached) {
  return std::make_unique<PosixFile>(fd, std::move(path), uncached);
}

}  // namespace dcp
