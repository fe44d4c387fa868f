#include "io/fs_commit.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "io/fs_layout.h"
#include "io/internal/parallel_work.h"
#include "io/metadata_format.h"

namespace dcp::internal_fs {
namespace {

constexpr size_t kMaxNamed = 6;

// Up to kMaxNamed subdirectories of `dir` holding a committed checkpoint
// (their own .metadata), in name order, for the message of a load pointed
// at a run's root (DIR/step-1000, DIR/step-2000, ...). Rank-local
// checkpoints (rank-R) are not counted; the first 1000 entries are looked
// at. Empty when `dir` cannot be listed.
std::vector<std::string> CheckpointsInside(FileSystemBase& fs,
                                           const std::string& dir) {
  std::vector<std::string> found;
  absl::StatusOr<std::vector<std::string>> names = fs.ListDir(dir);
  if (!names.ok()) return found;
  size_t looked = 0;
  for (const std::string& name : *names) {
    if (found.size() == kMaxNamed || ++looked > 1000) break;
    if (absl::StartsWith(name, ".") || absl::StartsWith(name, "rank-")) {
      continue;
    }
    absl::StatusOr<bool> holds =
        fs.Exists(JoinPath(JoinPath(dir, name), kMetadataFileName));
    if (holds.ok() && *holds) found.push_back(name);
  }
  return found;
}

}  // namespace

absl::Status NameCheckpointsInside(FileSystemBase& fs, const std::string& dir,
                                   absl::Status missing) {
  if (!absl::IsNotFound(missing)) return missing;
  const std::vector<std::string> inside = CheckpointsInside(fs, dir);
  if (inside.empty()) return missing;
  return absl::NotFoundError(absl::StrCat(
      "no committed checkpoint in ", dir, " itself (",
      JoinPath(dir, kMetadataFileName), " does not exist), but ",
      inside.size() == 1           ? "its subdirectory "
      : inside.size() == kMaxNamed ? "its subdirectories (among others) "
                                   : "its subdirectories ",
      absl::StrJoin(inside, ", "),
      inside.size() == 1 ? " holds one: pass it"
                         : " hold one each: pass one of them"));
}

absl::StatusOr<Metadata> ReadMetadataFile(FileSystemBase& fs,
                                          const std::string& dir) {
  const std::string metadata_path = JoinPath(dir, kMetadataFileName);
  absl::StatusOr<std::unique_ptr<File>> file = fs.OpenForRead(metadata_path);
  if (absl::IsNotFound(file.status())) {
    absl::StatusOr<bool> dir_exists = fs.Exists(dir);
    if (dir_exists.ok() && !*dir_exists) {
      return absl::NotFoundError(absl::StrCat(
          "no checkpoint at ", dir, ": the directory does not exist"));
    }
    return absl::NotFoundError(absl::StrCat(
        "no committed checkpoint in ", dir, " (", metadata_path,
        " does not exist; a save that did not finish leaves none)"));
  }
  if (!file.ok()) return file.status();
  DCP_ASSIGN_OR_RETURN(int64_t size, (*file)->Size());
  if (size > kMaxMetadataFileSize) {
    return absl::DataLossError(absl::StrCat(
        metadata_path, " is ", size,
        " bytes, more than any dcp metadata file (", kMaxMetadataFileSize,
        "); the directory holds no readable dcp "
        "checkpoint"));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  DCP_ASSIGN_OR_RETURN(
      size_t got, (*file)->PRead(0, {reinterpret_cast<std::byte*>(bytes.data()),
                                     bytes.size()}));
  bytes.resize(got);
  DCP_RETURN_IF_ERROR((*file)->Close());
  return DecodeMetadata(bytes, metadata_path);
}

bool HoldsPickledMetadata(FileSystemBase& fs, const std::string& path) {
  absl::StatusOr<std::unique_ptr<File>> file = fs.OpenForRead(path);
  if (!file.ok()) return false;
  std::byte head[2] = {};
  absl::StatusOr<size_t> got = (*file)->PRead(0, head);
  (*file)->Close().IgnoreError();
  // A pickle of protocol 2 to 5 opens with PROTO (0x80) and its number.
  return got.ok() && *got == 2 && head[0] == std::byte{0x80} &&
         head[1] >= std::byte{2} && head[1] <= std::byte{5};
}

absl::StatusOr<std::set<std::string>> CommittedFileNames(
    FileSystemBase& fs, const std::string& dir) {
  absl::StatusOr<Metadata> committed = ReadMetadataFile(fs, dir);
  if (absl::IsNotFound(committed.status())) return std::set<std::string>();
  if (!committed.ok()) return committed.status();
  std::set<std::string> names;
  for (const auto& [index, info] : committed->storage_data) {
    names.insert(info.relative_path);
  }
  return names;
}

absl::Status WriteMetadataFile(FileSystemBase& fs, const std::string& dir,
                               absl::string_view save_id,
                               absl::string_view encoded, bool sync,
                               CreatedFiles& created) {
  const std::string temp_path = JoinPath(dir, TempMetadataFileName(save_id));
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs.OpenForWrite(temp_path));
  created.Record(temp_path);
  DCP_RETURN_IF_ERROR(file->PWrite(
      0, {reinterpret_cast<const std::byte*>(encoded.data()), encoded.size()}));
  if (sync) DCP_RETURN_IF_ERROR(file->Sync());
  DCP_RETURN_IF_ERROR(file->Close());
  return RenameCommitFile(fs, temp_path, JoinPath(dir, kMetadataFileName),
                          encoded);
}

absl::Status RemoveReplacedFiles(FileSystemBase& fs, const std::string& dir,
                                 const std::set<std::string>& replaceable,
                                 const std::set<std::string>& committed,
                                 bool sync) {
  internal_io::FirstError error;
  bool removed_any = false;
  for (const std::string& name : replaceable) {
    if (committed.contains(name)) continue;
    absl::Status status = fs.RemoveFile(JoinPath(dir, name));
    if (status.ok()) {
      removed_any = true;
    } else if (!absl::IsNotFound(status)) {
      error.Update(std::move(status));
    }
  }
  if (removed_any && sync) error.Update(fs.SyncDir(dir));
  return error.status();
}

void CreatedFiles::Record(const std::string& path) {
  absl::MutexLock lock(&mu_);
  paths_.push_back(path);
}

void CreatedFiles::Forget() {
  absl::MutexLock lock(&mu_);
  paths_.clear();
}

void CreatedFiles::RemoveAll(FileSystemBase& fs) {
  std::vector<std::string> paths;
  {
    absl::MutexLock lock(&mu_);
    paths.swap(paths_);
  }
  for (const std::string& path : paths) fs.RemoveFile(path).IgnoreError();
}

}  // namespace dcp::internal_fs
