#include "io/fault_injection.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "io/internal/parallel_work.h"

namespace dcp {
namespace {

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// A partial write lands whole kDirectIoAlignment blocks (as the kernel's
// would; an O_DIRECT file takes nothing else); nothing of a smaller write.
size_t PartialLength(size_t length) {
  return static_cast<size_t>(internal_io::AlignDown(
      static_cast<int64_t>(length), internal_io::kDirectIoAlignment));
}

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

const char* FaultOpName(FaultOp op) {
  switch (op) {
    case FaultOp::kAny:
      return "any";
    case FaultOp::kOpen:
      return "open";
    case FaultOp::kWrite:
      return "pwrite";
    case FaultOp::kRead:
      return "pread";
    case FaultOp::kSync:
      return "fsync";
    case FaultOp::kClose:
      return "close";
    case FaultOp::kRename:
      return "rename";
    case FaultOp::kUnlink:
      return "unlink";
    case FaultOp::kMkdir:
      return "mkdir";
    case FaultOp::kSyncDir:
      return "fsync directory";
    case FaultOp::kList:
      return "opendir";
    case FaultOp::kPreallocate:
      return "fallocate";
    case FaultOp::kWriteback:
      return "sync_file_range";
  }
  return "?";
}

class FaultInjectionFileSystem::FaultyFile final : public File {
 public:
  FaultyFile(FaultInjectionFileSystem& fs, std::unique_ptr<File> base)
      : fs_(fs), base_(std::move(base)) {}
  ~FaultyFile() override {
    if (!closed_) fs_.NoteClosed();
  }

  const std::string& path() const override { return base_->path(); }

  absl::Status PWrite(int64_t offset,
                      absl::Span<const std::byte> data) override {
    const std::string what = absl::StrCat("pwrite ", path(), " offset=", offset,
                                          " length=", data.size());
    Decision d = fs_.Check(FaultOp::kWrite, path());
    if (d.fail) {
      const size_t half = PartialLength(data.size() / 2);
      if (d.short_write && half > 0) {
        DCP_RETURN_IF_ERROR(base_->PWrite(offset, data.first(half)));
      }
      return fs_.Failure(d, FaultOp::kWrite, what);
    }
    int error = 0;
    int64_t allowed =
        fs_.ClaimWriteBytes(static_cast<int64_t>(data.size()), &error);
    if (allowed < static_cast<int64_t>(data.size())) {
      allowed = static_cast<int64_t>(PartialLength(allowed));
    }
    if (allowed > 0) {
      DCP_RETURN_IF_ERROR(base_->PWrite(offset, data.first(allowed)));
    }
    if (allowed < static_cast<int64_t>(data.size())) {
      return ErrnoError(
          error,
          absl::StrCat("pwrite ", path(), " offset=", offset + allowed,
                       " length=", data.size() - allowed, " (injected)"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> PRead(int64_t offset,
                               absl::Span<std::byte> buffer) override {
    Decision d = fs_.Check(FaultOp::kRead, path());
    if (d.fail) {
      return fs_.Failure(d, FaultOp::kRead,
                         absl::StrCat("pread ", path(), " offset=", offset,
                                      " length=", buffer.size()));
    }
    return base_->PRead(offset, buffer);
  }

  absl::Status Sync() override {
    Decision d = fs_.Check(FaultOp::kSync, path());
    if (d.fail) {
      return fs_.Failure(d, FaultOp::kSync, absl::StrCat("fsync ", path()));
    }
    DCP_RETURN_IF_ERROR(base_->Sync());
    DCP_ASSIGN_OR_RETURN(int64_t size, base_->Size());
    fs_.NoteSynced(path(), size);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Size() override { return base_->Size(); }

  absl::Status Preallocate(int64_t size) override {
    Decision d = fs_.Check(FaultOp::kPreallocate, path());
    if (d.fail) {
      return fs_.Failure(d, FaultOp::kPreallocate,
                         absl::StrCat("fallocate ", path(), " length=", size));
    }
    return base_->Preallocate(size);
  }
  absl::Status StartWriteback(int64_t offset, int64_t length) override {
    Decision d = fs_.Check(FaultOp::kWriteback, path());
    if (d.fail) {
      return fs_.Failure(d, FaultOp::kWriteback,
                         absl::StrCat("sync_file_range ", path(),
                                      " offset=", offset, " length=", length));
    }
    return base_->StartWriteback(offset, length);
  }
  // Truncation passes through (no fault site of its own).
  absl::Status Truncate(int64_t size) override { return base_->Truncate(size); }
  bool direct() const override { return base_->direct(); }

  absl::Status Close() override {
    if (closed_) return base_->Close();  // Reports the closed state.
    closed_ = true;
    fs_.NoteClosed();
    Decision d = fs_.Check(FaultOp::kClose, path());
    absl::Status closed = base_->Close();  // Closed even when it "fails".
    if (d.fail) {
      return fs_.Failure(d, FaultOp::kClose, absl::StrCat("close ", path()));
    }
    return closed;
  }

 private:
  FaultInjectionFileSystem& fs_;
  std::unique_ptr<File> base_;
  bool closed_ = false;
};

FaultInjectionFileSystem::FaultInjectionFileSystem(FileSystemBase& base)
    : base_(base) {}

FaultInjectionFileSystem::~FaultInjectionFileSystem() = default;

void FaultInjectionFileSystem::Inject(Fault fault) {
  absl::MutexLock lock(&mu_);
  faults_.push_back({std::move(fault), 0});
}

void FaultInjectionFileSystem::FailOneIn(int64_t n, uint64_t seed, int error) {
  absl::MutexLock lock(&mu_);
  one_in_ = n;
  rng_ = seed;
  one_in_error_ = error;
}

void FaultInjectionFileSystem::FailWritesAfter(int64_t bytes, int error) {
  absl::MutexLock lock(&mu_);
  write_budget_ = bytes;
  write_budget_error_ = error;
}

void FaultInjectionFileSystem::ClearFaults() {
  absl::MutexLock lock(&mu_);
  faults_.clear();
  one_in_ = 0;
  write_budget_ = -1;
}

int64_t FaultInjectionFileSystem::calls(FaultOp op) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(op);
  return it == calls_.end() ? 0 : it->second;
}

int FaultInjectionFileSystem::open_files() const {
  absl::MutexLock lock(&mu_);
  return open_files_;
}

FaultInjectionFileSystem::Decision FaultInjectionFileSystem::Check(
    FaultOp op, const std::string& path) {
  absl::MutexLock lock(&mu_);
  ++calls_[op];
  ++calls_[FaultOp::kAny];
  Decision d;
  for (Armed& armed : faults_) {
    const Fault& f = armed.fault;
    if (armed.fired && f.crash) {
      if (!d.fail) d = {true, false, f.error};
      continue;
    }
    if (f.op != FaultOp::kAny && f.op != op) continue;
    if (!f.path_contains.empty() && !absl::StrContains(path, f.path_contains)) {
      continue;
    }
    ++armed.seen;
    if (f.nth == 0 || armed.seen == f.nth) {
      armed.fired = true;
      if (!d.fail) {
        d = {true, f.short_write && op == FaultOp::kWrite, f.error,
             f.after && op == FaultOp::kRename};
      }
    }
  }
  if (!d.fail && one_in_ > 0 &&
      SplitMix(rng_) % static_cast<uint64_t>(one_in_) == 0) {
    d = {true, false, one_in_error_};
  }
  return d;
}

absl::Status FaultInjectionFileSystem::Failure(const Decision& d, FaultOp op,
                                               const std::string& what) {
  (void)op;
  return ErrnoError(d.error, absl::StrCat(what, " (injected)"));
}

int64_t FaultInjectionFileSystem::ClaimWriteBytes(int64_t length, int* error) {
  absl::MutexLock lock(&mu_);
  if (write_budget_ < 0) return length;
  const int64_t allowed = std::min(length, write_budget_);
  write_budget_ -= allowed;
  *error = write_budget_error_;
  return allowed;
}

void FaultInjectionFileSystem::NoteSynced(const std::string& path,
                                          int64_t size) {
  absl::MutexLock lock(&mu_);
  synced_size_[path] = size;
}

void FaultInjectionFileSystem::NoteClosed() {
  absl::MutexLock lock(&mu_);
  --open_files_;
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectionFileSystem::OpenForWrite(
    const std::string& path, const OpenOptions& options) {
  Decision d = Check(FaultOp::kOpen, path);
  if (d.fail) {
    return Failure(d, FaultOp::kOpen, absl::StrCat("open for write ", path));
  }
  DCP_ASSIGN_OR_RETURN(bool existed, base_.Exists(path));
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                       base_.OpenForWrite(path, options));
  absl::MutexLock lock(&mu_);
  ++open_files_;
  synced_size_[path] = 0;  // New or truncated: nothing durable yet.
  if (!existed) unsynced_creates_.push_back(path);
  return std::unique_ptr<File>(new FaultyFile(*this, std::move(file)));
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectionFileSystem::OpenForRead(
    const std::string& path, const OpenOptions& options) {
  Decision d = Check(FaultOp::kOpen, path);
  if (d.fail) {
    return Failure(d, FaultOp::kOpen, absl::StrCat("open for read ", path));
  }
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                       base_.OpenForRead(path, options));
  absl::MutexLock lock(&mu_);
  ++open_files_;
  return std::unique_ptr<File>(new FaultyFile(*this, std::move(file)));
}

absl::Status FaultInjectionFileSystem::Rename(const std::string& from,
                                              const std::string& to) {
  Decision d = Check(FaultOp::kRename, from);
  if (d.fail && !d.after) {
    return Failure(d, FaultOp::kRename,
                   absl::StrCat("rename ", from, " to ", to));
  }
  PendingRename pending{from, to, false, ""};
  DCP_ASSIGN_OR_RETURN(pending.replaced, base_.Exists(to));
  if (pending.replaced) {
    // Keep the replaced file's bytes so a simulated crash can restore it.
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> old, base_.OpenForRead(to, {}));
    DCP_ASSIGN_OR_RETURN(int64_t size, old->Size());
    pending.replaced_bytes.resize(size);
    DCP_RETURN_IF_ERROR(old->PRead(0, {reinterpret_cast<std::byte*>(
                                           pending.replaced_bytes.data()),
                                       pending.replaced_bytes.size()})
                            .status());
  }
  DCP_RETURN_IF_ERROR(base_.Rename(from, to));
  absl::MutexLock lock(&mu_);
  if (auto it = synced_size_.find(from); it != synced_size_.end()) {
    synced_size_[to] = it->second;
    synced_size_.erase(from);
  }
  unsynced_renames_.push_back(std::move(pending));
  if (d.fail) {
    return Failure(d, FaultOp::kRename,
                   absl::StrCat("rename ", from, " to ", to));
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::RemoveFile(const std::string& path) {
  Decision d = Check(FaultOp::kUnlink, path);
  if (d.fail)
    return Failure(d, FaultOp::kUnlink, absl::StrCat("unlink ", path));
  DCP_RETURN_IF_ERROR(base_.RemoveFile(path));
  absl::MutexLock lock(&mu_);
  synced_size_.erase(path);
  std::erase(unsynced_creates_, path);
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::CreateDir(const std::string& path) {
  Decision d = Check(FaultOp::kMkdir, path);
  if (d.fail) return Failure(d, FaultOp::kMkdir, absl::StrCat("mkdir ", path));
  return base_.CreateDir(path);
}

absl::StatusOr<bool> FaultInjectionFileSystem::Exists(const std::string& path) {
  return base_.Exists(path);
}

absl::StatusOr<bool> FaultInjectionFileSystem::IsSymbolicLink(
    const std::string& path) {
  return base_.IsSymbolicLink(path);
}

absl::StatusOr<std::vector<std::string>> FaultInjectionFileSystem::ListDir(
    const std::string& path) {
  Decision d = Check(FaultOp::kList, path);
  if (d.fail) return Failure(d, FaultOp::kList, absl::StrCat("opendir ", path));
  return base_.ListDir(path);
}

absl::Status FaultInjectionFileSystem::SyncDir(const std::string& path) {
  Decision d = Check(FaultOp::kSyncDir, path);
  if (d.fail) {
    return Failure(d, FaultOp::kSyncDir,
                   absl::StrCat("fsync directory ", path));
  }
  DCP_RETURN_IF_ERROR(base_.SyncDir(path));
  absl::MutexLock lock(&mu_);
  std::erase_if(unsynced_creates_,
                [&](const std::string& p) { return DirOf(p) == path; });
  std::erase_if(unsynced_renames_,
                [&](const PendingRename& r) { return DirOf(r.to) == path; });
  return absl::OkStatus();
}

void FaultInjectionFileSystem::SimulateCrash() {
  absl::MutexLock lock(&mu_);
  // Undo renames, newest first: the new name goes back to the old one and
  // the replaced file returns.
  for (auto it = unsynced_renames_.rbegin(); it != unsynced_renames_.rend();
       ++it) {
    if (!base_.Rename(it->to, it->from).ok()) continue;
    if (auto s = synced_size_.find(it->to); s != synced_size_.end()) {
      synced_size_[it->from] = s->second;
      synced_size_.erase(s);
    }
    if (it->replaced) {
      absl::StatusOr<std::unique_ptr<File>> file = base_.OpenForWrite(
          it->to, OpenOptions{/*exclusive=*/false, /*direct=*/false});
      if (file.ok()) {
        (*file)
            ->PWrite(
                0,
                {reinterpret_cast<const std::byte*>(it->replaced_bytes.data()),
                 it->replaced_bytes.size()})
            .IgnoreError();
        (*file)->Close().IgnoreError();
      }
    }
  }
  // Entries created since their directory's last fsync vanish.
  for (const std::string& path : unsynced_creates_) {
    base_.RemoveFile(path).IgnoreError();
    synced_size_.erase(path);
  }
  // Written files keep what their last fsync made durable (this models a
  // local file system; the base must be LocalFileSystem()).
  for (const auto& [path, size] : synced_size_) {
    if (::truncate(path.c_str(), size) != 0) continue;
  }
  unsynced_renames_.clear();
  unsynced_creates_.clear();
  synced_size_.clear();
}

absl::StatusOr<std::unique_ptr<DirectoryLock>>
FaultInjectionFileSystem::LockDirectory(const std::string& dir,
                                        absl::string_view holder,
                                        LockMode mode) {
  return base_.LockDirectory(dir, holder, mode);
}

}  // namespace dcp
