// The files of a Hugging Face checkpoint directory: their names
// (HfFileName), which of them a load reads (ResolveHfCheckpointFiles), and
// what a save completes, cleans up and replaces before it writes
// (internal_hf::RollForward, RemoveTemporaryFiles, ReplaceableFiles).
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/status.h"
#include "io/file_system.h"
#include "io/hf_storage.h"
#include "io/internal/commit_journal.h"
#include "io/internal/hf_internal.h"
#include "io/safetensors.h"
#include "nlohmann/json.hpp"

namespace dcp {

using internal_hf::CheckRelativePath;
using internal_io::ReadSmallFile;
using Json = nlohmann::json;

namespace {

bool AllDigits(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](char c) { return c >= '0' && c <= '9'; });
}

// "model-NNNNN-of-NNNNN.safetensors" (what HfFileName makes).
bool IsModelFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "model-") ||
      !absl::ConsumeSuffix(&name, ".safetensors")) {
    return false;
  }
  std::vector<absl::string_view> parts = absl::StrSplit(name, "-of-");
  return parts.size() == 2 && AllDigits(parts[0]) && AllDigits(parts[1]);
}

// "shard-NNNNN-model-NNNNN-of-NNNNN.safetensors".
bool IsShardFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "shard-")) return false;
  const size_t dash = name.find('-');
  return dash != absl::string_view::npos && AllDigits(name.substr(0, dash)) &&
         IsModelFileName(name.substr(dash + 1));
}

// Whether `relative` may be a final name of a checkpoint file: a
// safetensors file or the index, in the directory or sharded/.
bool IsCheckpointFileName(absl::string_view relative) {
  absl::string_view base = relative.substr(relative.rfind('/') + 1);
  return CheckRelativePath(relative).ok() &&
         (absl::EndsWith(base, ".safetensors") || base == kHfIndexFileName);
}

// Safetensors names of `dir`'s entries that are not hidden, sorted.
absl::StatusOr<std::vector<std::string>> SafetensorsFilesIn(
    FileSystemBase& fs, const std::string& dir) {
  DCP_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDir(dir));
  std::vector<std::string> files;
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, ".") && absl::EndsWith(name, ".safetensors")) {
      files.push_back(name);
    }
  }
  return files;
}

}  // namespace

std::string HfFileName(int index, int count, std::optional<int> shard) {
  std::string name =
      absl::StrFormat("model-%05d-of-%05d.safetensors", index, count);
  if (shard.has_value()) name = absl::StrFormat("shard-%05d-%s", *shard, name);
  return name;
}

absl::StatusOr<std::vector<std::string>> ResolveHfCheckpointFiles(
    FileSystemBase& fs, const std::string& dir,
    std::map<std::string, std::string>* weight_map) {
  if (weight_map != nullptr) weight_map->clear();
  DCP_RETURN_IF_ERROR(internal_io::CompletePendingCommitForRead(
      fs, dir, kHfCommitJournalName, IsCheckpointFileName));
  DCP_ASSIGN_OR_RETURN(bool single,
                       fs.Exists(JoinPath(dir, kHfSingleFileName)));
  if (single) return std::vector<std::string>{kHfSingleFileName};
  const std::string index_path = JoinPath(dir, kHfIndexFileName);
  absl::StatusOr<std::string> index = ReadSmallFile(
      fs, index_path, kHfMaxIndexBytes, internal_hf::kHfReadersFollowLinks);
  if (index.ok()) {
    DCP_ASSIGN_OR_RETURN(Json json, ParseUntrustedJson(*index, index_path));
    if (!json.is_object() || !json.contains("weight_map") ||
        !json["weight_map"].is_object()) {
      return absl::DataLossError(
          absl::StrCat(index_path, " has no \"weight_map\" object"));
    }
    std::set<std::string> files;
    for (const auto& [fqn, file] : json["weight_map"].items()) {
      if (!file.is_string() ||
          !internal_hf::CheckPlainName(file.get<std::string>()).ok()) {
        return absl::DataLossError(absl::StrCat(
            index_path, " maps \"", fqn, "\" to ", DescribeJsonValue(file),
            ", not a file name in the directory"));
      }
      files.insert(file.get<std::string>());
      if (weight_map != nullptr) weight_map->emplace(fqn, file);
    }
    return std::vector<std::string>(files.begin(), files.end());
  }
  if (!absl::IsNotFound(index.status())) return index.status();
  absl::StatusOr<std::vector<std::string>> top = SafetensorsFilesIn(fs, dir);
  if (!top.ok()) {
    if (absl::IsNotFound(top.status())) {
      return absl::NotFoundError(
          absl::StrCat("no Hugging Face checkpoint in ", dir,
                       " (the directory does not exist)"));
    }
    return top.status();
  }
  if (!top->empty()) return top;
  const std::string sharded = JoinPath(dir, kHfShardedDirName);
  // Files are opened without following a symbolic link in their last
  // component only: a `sharded` that is a link would reach files outside
  // the checkpoint.
  absl::StatusOr<bool> link = fs.IsSymbolicLink(sharded);
  if (!link.ok()) return link.status();
  if (*link) {
    return absl::NotFoundError(absl::StrCat(
        "no Hugging Face checkpoint in ", dir, " (no ", kHfSingleFileName, ", ",
        kHfIndexFileName, " or *.safetensors file there, and ",
        kHfShardedDirName, " is a symbolic link, which is not followed)"));
  }
  absl::StatusOr<std::vector<std::string>> shards =
      SafetensorsFilesIn(fs, sharded);
  if (shards.ok() && !shards->empty()) {
    for (std::string& name : *shards) {
      name = absl::StrCat(kHfShardedDirName, "/", name);
    }
    return shards;
  }
  return absl::NotFoundError(absl::StrCat(
      "no Hugging Face checkpoint in ", dir, " (no ", kHfSingleFileName, ", ",
      kHfIndexFileName, " or *.safetensors file, there or in ",
      kHfShardedDirName, "/)"));
}

namespace internal_hf {

// Completes the commit a journal in `dir` records, if there is one.
absl::Status RollForward(FileSystemBase& fs, const std::string& dir,
                         bool sync) {
  return internal_io::CompleteCommit(fs, dir, kHfCommitJournalName,
                                     IsCheckpointFileName, sync);
}

// Removes the temporary files of interrupted saves from `dir` (and
// sharded/): names ".NAME.tmp-<save id>", and the probe files
// (IsProbeFileName) in `dir`; nothing else.
void RemoveTemporaryFiles(FileSystemBase& fs, const std::string& dir) {
  for (const std::string& sub :
       {std::string(), std::string(kHfShardedDirName)}) {
    const std::string d = sub.empty() ? dir : JoinPath(dir, sub);
    absl::StatusOr<std::vector<std::string>> names = fs.ListDir(d);
    if (!names.ok()) continue;
    for (const std::string& name : *names) {
      if (internal_io::IsTemporaryFileName(name) ||
          (sub.empty() && IsProbeFileName(name))) {
        fs.RemoveFile(JoinPath(d, name)).IgnoreError();
      }
    }
  }
}

// The files of the checkpoint in `dir` that a new save replaces: the
// single file, the index and what it names, the files a Hugging Face
// writer names `model-N-of-M`, and the shards (`shard-R-model-N-of-M`) in
// the directory and in sharded/. Never other
// files (a LoRA adapter, a tokenizer). The listing's error when `dir`
// cannot be listed; a missing sharded/ holds nothing.
absl::StatusOr<std::set<std::string>> ReplaceableFiles(FileSystemBase& fs,
                                                       const std::string& dir) {
  std::set<std::string> files;
  // Never taken for empty when it cannot be listed: the save would commit
  // beside the old checkpoint's model.safetensors, which readers prefer.
  DCP_ASSIGN_OR_RETURN(std::vector<std::string> names, fs.ListDir(dir));
  for (const std::string& name : names) {
    if (name == kHfSingleFileName || name == kHfIndexFileName ||
        IsModelFileName(name) || IsShardFileName(name)) {
      files.insert(name);
    }
  }
  std::map<std::string, std::string> weight_map;
  if (files.contains(kHfIndexFileName) &&
      ResolveHfCheckpointFiles(fs, dir, &weight_map).ok()) {
    for (const auto& [fqn, file] : weight_map) {
      if (absl::EndsWith(file, ".safetensors")) files.insert(file);
    }
  }
  absl::StatusOr<std::vector<std::string>> shards =
      fs.ListDir(JoinPath(dir, kHfShardedDirName));
  if (shards.ok()) {
    for (const std::string& name : *shards) {
      if (IsShardFileName(name)) {
        files.insert(absl::StrCat(kHfShardedDirName, "/", name));
      }
    }
  }
  return files;
}

}  // namespace internal_hf
}  // namespace dcp
