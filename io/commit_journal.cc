#include "io/internal/commit_journal.h"

#include <algorithm>
#include <exception>
#include <set>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/types/optional.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace dcp::internal_io {
namespace {

using Json = nlohmann::json;

// The most bytes a journal may have (it lists file names).
constexpr int64_t kMaxJournalBytes = int64_t{64} << 20;

// A relative path of plain components (no "", ".", "..", NUL).
bool IsRelativePath(absl::string_view path) {
  if (path.empty() || path.find('\0') != absl::string_view::npos) return false;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

absl::string_view DirectoryOf(absl::string_view relative) {
  const size_t slash = relative.rfind('/');
  return slash == absl::string_view::npos ? absl::string_view()
                                          : relative.substr(0, slash);
}

absl::string_view BaseOf(absl::string_view relative) {
  return relative.substr(relative.rfind('/') + 1);
}

}  // namespace

bool IsTemporaryFileName(absl::string_view name) {
  const size_t at = name.rfind(".tmp-");
  if (!absl::StartsWith(name, ".") || at == absl::string_view::npos) {
    return false;
  }
  const absl::string_view id = name.substr(at + 5);
  return id.size() == 16 &&
         id.find_first_not_of("0123456789abcdef") == absl::string_view::npos;
}

std::string EncodeCommitJournal(const CommitJournal& journal) {
  Json renames = Json::array();
  for (const auto& [from, to] : journal.renames) renames.push_back({from, to});
  return Json{{"renames", renames}, {"removals", journal.removals}}.dump(1);
}

absl::StatusOr<CommitJournal> DecodeCommitJournal(
    absl::string_view text, const std::string& path,
    CheckpointFileTest is_checkpoint_file) {
  CommitJournal journal;
  try {
    const Json json = Json::parse(text.begin(), text.end());
    for (const Json& pair : json.at("renames")) {
      if (pair.size() != 2) throw std::invalid_argument("a rename's size");
      journal.renames.emplace_back(pair.at(0).get<std::string>(),
                                   pair.at(1).get<std::string>());
    }
    journal.removals = json.at("removals").get<std::vector<std::string>>();
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(
        "commit journal ", path,
        " is malformed: expected {\"renames\": [[temporary, final], ...], "
        "\"removals\": [...]} (",
        e.what(), ")"));
  }
  for (const auto& [from, to] : journal.renames) {
    if (!IsRelativePath(from) || !IsRelativePath(to) ||
        !IsTemporaryFileName(BaseOf(from)) ||
        DirectoryOf(from) != DirectoryOf(to) || !is_checkpoint_file(to)) {
      return absl::DataLossError(absl::StrCat("commit journal ", path,
                                              " is malformed: rename \"", from,
                                              "\" -> \"", to, "\""));
    }
  }
  for (const std::string& name : journal.removals) {
    if (!IsRelativePath(name) || !is_checkpoint_file(name)) {
      return absl::DataLossError(absl::StrCat(
          "commit journal ", path, " is malformed: removal \"", name, "\""));
    }
  }
  return journal;
}

absl::Status ApplyCommitJournal(FileSystemBase& fs, const std::string& dir,
                                absl::string_view journal_name,
                                const CommitJournal& journal, bool sync) {
  std::set<std::string> dirs = {dir};
  for (const auto& [from, to] : journal.renames) {
    absl::Status renamed = fs.Rename(JoinPath(dir, from), JoinPath(dir, to));
    if (absl::IsNotFound(renamed)) {
      // Renamed before, so the final name must be there. Neither there:
      // the save's file is gone, and the journal would name what is not.
      DCP_ASSIGN_OR_RETURN(bool there, fs.Exists(JoinPath(dir, to)));
      if (!there) {
        return absl::DataLossError(absl::StrCat(
            "completing the commit of ", JoinPath(dir, journal_name), ": ",
            from, " and ", to, " are both missing"));
      }
    } else if (!renamed.ok()) {
      return Annotate(renamed, "completing the commit");
    }
    if (!DirectoryOf(to).empty()) dirs.insert(JoinPath(dir, DirectoryOf(to)));
  }
  for (const std::string& name : journal.removals) {
    if (!DirectoryOf(name).empty()) {
      dirs.insert(JoinPath(dir, DirectoryOf(name)));
    }
  }
  if (sync) {
    for (const std::string& d : dirs) DCP_RETURN_IF_ERROR(fs.SyncDir(d));
  }
  for (const std::string& name : journal.removals) {
    absl::Status removed = fs.RemoveFile(JoinPath(dir, name));
    if (!removed.ok() && !absl::IsNotFound(removed)) {
      return Annotate(removed, "removing a file of the replaced checkpoint");
    }
  }
  if (sync) {
    for (const std::string& d : dirs) DCP_RETURN_IF_ERROR(fs.SyncDir(d));
  }
  DCP_RETURN_IF_ERROR(fs.RemoveFile(JoinPath(dir, journal_name)));
  if (sync) DCP_RETURN_IF_ERROR(fs.SyncDir(dir));
  return absl::OkStatus();
}

absl::Status CompleteCommit(FileSystemBase& fs, const std::string& dir,
                            absl::string_view journal_name,
                            CheckpointFileTest is_checkpoint_file, bool sync) {
  const std::string path = JoinPath(dir, journal_name);
  absl::StatusOr<std::string> text = ReadSmallFile(fs, path, kMaxJournalBytes);
  if (absl::IsNotFound(text.status())) return absl::OkStatus();
  if (!text.ok()) return text.status();
  DCP_ASSIGN_OR_RETURN(CommitJournal journal,
                       DecodeCommitJournal(*text, path, is_checkpoint_file));
  return ApplyCommitJournal(fs, dir, journal_name, journal, sync);
}

absl::Status CompletePendingCommitForRead(FileSystemBase& fs,
                                          const std::string& dir,
                                          absl::string_view journal_name,
                                          CheckpointFileTest is_checkpoint_file,
                                          absl::Duration wait) {
  const std::string path = JoinPath(dir, journal_name);
  DCP_ASSIGN_OR_RETURN(bool pending, fs.Exists(path));
  if (!pending) return absl::OkStatus();
  auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the commit of a save into ", dir, " was interrupted (", path,
        " is there) and a load cannot complete it now: ", why,
        "; the next save into the directory, or a load that can lock and "
        "write it, completes it"));
  };
  const std::string holder =
      absl::StrCat(ThisProcessDescription(), kReaderLockHolder);
  const absl::Time deadline = absl::Now() + wait;
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    absl::StatusOr<std::unique_ptr<DirectoryLock>> lock =
        fs.LockDirectory(dir, holder, LockMode::kExclusive);
    if (lock.ok()) {
      absl::Status completed =
          CompleteCommit(fs, dir, journal_name, is_checkpoint_file,
                         /*sync=*/true);
      if (!completed.ok()) return refuse(completed.ToString());
      return absl::OkStatus();
    }
    // Completed meanwhile by whoever holds the lock (another reader, or a
    // save's set-up)?
    DCP_ASSIGN_OR_RETURN(pending, fs.Exists(path));
    if (!pending) return absl::OkStatus();
    // Held by another: wait for the holder; no lock to be had at all (a
    // read-only directory, a lock file that is no regular file): refuse
    // now.
    const absl::Duration left = deadline - absl::Now();
    if (!IsLockHeld(lock.status()) || left <= absl::ZeroDuration()) {
      return refuse(lock.status().message());
    }
    absl::SleepFor(std::min(pause, left));
    pause = std::min(2 * pause, absl::Milliseconds(100));
  }
}

absl::StatusOr<Metadata> DescribeWhileCommitsMayRun(
    absl::FunctionRef<absl::StatusOr<Metadata>()> describe) {
  absl::Duration pause = absl::Milliseconds(2);
  for (int tries = 1;; ++tries) {
    absl::StatusOr<Metadata> described = describe();
    if (described.ok() || !absl::IsDataLoss(described.status()) || tries == 3) {
      return described;
    }
    absl::SleepFor(pause);
    pause *= 10;
  }
}

absl::StatusOr<std::string> ReadSmallFile(FileSystemBase& fs,
                                          const std::string& path,
                                          int64_t limit, bool follow_links) {
  OpenOptions options;
  options.exclusive = false;
  options.no_follow = !follow_links;
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                       fs.OpenForRead(path, options));
  DCP_ASSIGN_OR_RETURN(const int64_t size, file->Size());
  if (size > limit) {
    return absl::DataLossError(absl::StrCat(path, " is ", size,
                                            " bytes, more than the ", limit,
                                            " a reader accepts"));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  DCP_ASSIGN_OR_RETURN(
      size_t got, file->PRead(0, {reinterpret_cast<std::byte*>(bytes.data()),
                                  bytes.size()}));
  bytes.resize(got);
  DCP_RETURN_IF_ERROR(file->Close());
  return bytes;
}

absl::Status WriteSmallFile(FileSystemBase& fs, const std::string& path,
                            absl::string_view bytes, bool sync) {
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs.OpenForWrite(path));
  DCP_RETURN_IF_ERROR(file->PWrite(
      0, {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}));
  if (sync) DCP_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

void JournaledSave::Reset() {
  lock_.reset();
  decided_ = false;
  committed_ = false;
  absl::MutexLock lock(&mu_);
  created_.clear();
}

absl::Status JournaledSave::LockAndRecover(
    FileSystemBase& fs, const std::string& dir, const std::string& holder,
    absl::FunctionRef<absl::Status()> recover) {
  const absl::Time deadline = absl::Now() + kReaderLockWait;
  absl::Duration pause = absl::Milliseconds(1);
  while (lock_ == nullptr) {
    absl::StatusOr<std::unique_ptr<DirectoryLock>> lock =
        fs.LockDirectory(dir, holder, LockMode::kExclusive);
    if (lock.ok()) {
      lock_ = *std::move(lock);
      break;
    }
    const absl::optional<absl::Cord> held =
        lock.status().GetPayload(kLockHeldPayload);
    const absl::Duration left = deadline - absl::Now();
    // A holder that has not described itself yet has just taken the lock:
    // asked again, it says what it is.
    const std::string description =
        held.has_value() ? std::string(*held) : std::string();
    if (!IsLockHeld(lock.status()) || !held.has_value() ||
        !(description.empty() ||
          absl::EndsWith(description, kReaderLockHolder)) ||
        left <= absl::ZeroDuration()) {
      return lock.status();
    }
    absl::SleepFor(std::min(pause, left));
    pause = std::min(2 * pause, absl::Milliseconds(50));
  }
  absl::Status status = recover();
  if (!status.ok()) lock_.reset();
  return status;
}

void JournaledSave::RecordCreated(const std::string& path) {
  absl::MutexLock lock(&mu_);
  created_.push_back(path);
}

absl::Status JournaledSave::Commit(FileSystemBase& fs, const std::string& dir,
                                   absl::string_view journal_name,
                                   const std::string& temp_journal,
                                   const CommitJournal& journal, bool sync) {
  RecordCreated(temp_journal);
  const std::string encoded = EncodeCommitJournal(journal);
  DCP_RETURN_IF_ERROR(WriteSmallFile(fs, temp_journal, encoded, sync));
  DCP_RETURN_IF_ERROR(
      RenameCommitFile(fs, temp_journal, JoinPath(dir, journal_name), encoded));
  decided_ = true;
  if (sync) DCP_RETURN_IF_ERROR(fs.SyncDir(dir));
  DCP_RETURN_IF_ERROR(ApplyCommitJournal(fs, dir, journal_name, journal, sync));
  committed_ = true;
  absl::MutexLock lock(&mu_);
  created_.clear();
  return absl::OkStatus();
}

void JournaledSave::MarkCommitted() {
  committed_ = true;
  {
    absl::MutexLock lock(&mu_);
    created_.clear();
  }
  lock_.reset();
}

void JournaledSave::Abort(FileSystemBase& fs,
                          absl::FunctionRef<absl::Status()> complete) {
  std::vector<std::string> created;
  {
    absl::MutexLock lock(&mu_);
    created.swap(created_);
  }
  if (decided_ && !committed_) {
    complete().IgnoreError();
  } else if (!committed_) {
    for (const std::string& path : created) fs.RemoveFile(path).IgnoreError();
  }
  lock_.reset();
}

}  // namespace dcp::internal_io
