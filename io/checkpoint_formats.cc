#include "io/checkpoint_formats.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "io/mega_format.h"
#include "io/metadata_format.h"

namespace dcp {
namespace {

absl::StatusOr<std::string> FirstExisting(FileSystemBase& fs,
                                          std::vector<std::string> paths) {
  for (std::string& path : paths) {
    DCP_ASSIGN_OR_RETURN(bool exists, fs.Exists(path));
    if (exists) return std::move(path);
  }
  return std::string();
}

}  // namespace

std::string RankLocalDirectory(absl::string_view dir, int rank) {
  return JoinPath(dir, absl::StrCat("rank-", rank));
}

absl::string_view CheckpointFormatName(CheckpointFormat format) {
  switch (format) {
    case CheckpointFormat::kDcp:
      return "dcp";
    case CheckpointFormat::kMega:
      return "MEGA";
    case CheckpointFormat::kHuggingFace:
      return "Hugging Face";
  }
  return "unknown";
}

absl::StatusOr<std::string> CheckpointFormatEvidence(FileSystemBase& fs,
                                                     const std::string& dir,
                                                     CheckpointFormat format,
                                                     bool list) {
  switch (format) {
    case CheckpointFormat::kDcp:
      return FirstExisting(
          fs, {JoinPath(dir, kMetadataFileName),
               JoinPath(RankLocalDirectory(dir, 0), kMetadataFileName)});
    case CheckpointFormat::kMega:
      return FirstExisting(fs, {JoinPath(dir, kMegaIndexFileName),
                                JoinPath(dir, kMegaCommitJournalName)});
    case CheckpointFormat::kHuggingFace: {
      if (!list) {
        return FirstExisting(fs, {JoinPath(dir, kHfIndexFileName),
                                  JoinPath(dir, kHfSingleFileName),
                                  JoinPath(dir, kHfCommitJournalName)});
      }
      DCP_ASSIGN_OR_RETURN(bool exists, fs.Exists(dir));
      if (!exists) return std::string();
      DCP_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDir(dir));
      for (const std::string& name : names) {
        if (absl::EndsWith(name, ".safetensors") || name == kHfIndexFileName ||
            name == kHfCommitJournalName) {
          return JoinPath(dir, name);
        }
      }
      // A distributed save's shards (an empty sharded/ is no checkpoint).
      const std::string sharded = JoinPath(dir, kHfShardedDirName);
      if (std::find(names.begin(), names.end(), kHfShardedDirName) ==
          names.end()) {
        return std::string();
      }
      absl::StatusOr<std::vector<std::string>> shards = fs.ListDir(sharded);
      if (!shards.ok()) return std::string();  // not a directory
      for (const std::string& name : *shards) {
        if (absl::EndsWith(name, ".safetensors")) {
          return JoinPath(sharded, name);
        }
      }
      return std::string();
    }
  }
  return std::string();
}

absl::Status RefuseOtherFormats(FileSystemBase& fs, const std::string& dir,
                                CheckpointFormat own, bool list) {
  for (CheckpointFormat other :
       {CheckpointFormat::kDcp, CheckpointFormat::kMega,
        CheckpointFormat::kHuggingFace}) {
    if (other == own) continue;
    absl::StatusOr<std::string> found =
        CheckpointFormatEvidence(fs, dir, other, list);
    if (!found.ok()) {
      return Annotate(found.status(),
                      absl::StrCat("cannot tell whether ", dir, " holds a ",
                                   CheckpointFormatName(other), " checkpoint"));
    }
    const std::string& evidence = *found;
    if (evidence.empty()) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " already holds a ", CheckpointFormatName(other), " checkpoint (",
        evidence, "); a ", CheckpointFormatName(own),
        " save beside it would leave two checkpoints in one directory, and a "
        "load by path would pick one by format, not by age: save into "
        "another directory or remove that checkpoint first"));
  }
  return absl::OkStatus();
}

}  // namespace dcp
