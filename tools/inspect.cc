// `dcp inspect DIR`, `dcp verify DIR` and `dcp verify --clean DIR` (Hugging
// Face directories: tools/inspect_hf.cc).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "core/checksum.h"
#include "core/status.h"
#include "io/extensions.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/mega_storage.h"
#include "io/metadata_format.h"
#include "io/storage_registry.h"
#include "tools/commands.h"

namespace dcp {
namespace {

// The committed metadata of the checkpoint `id` names: a dcp directory or a
// MEGA one (a `mega://` id, or a directory holding a MEGA index), through
// the reader the storage registry picks for a load.
// Whether `dir`/.metadata opens as a Python pickle (protocol 2 to 5), as
// torch.distributed.checkpoint writes it.
bool HoldsTorchDcpMetadata(const std::string& dir) {
  std::ifstream file(JoinPath(dir, kMetadataFileName), std::ios::binary);
  char head[2] = {};
  return file.read(head, 2) && static_cast<unsigned char>(head[0]) == 0x80 &&
         head[1] >= 2 && head[1] <= 5;
}

// kUnimplemented for the torch.distributed.checkpoint directory `id`,
// naming the conversion.
absl::Status TorchDcpCheckpointError(const std::string& id) {
  return absl::UnimplementedError(absl::StrCat(
      id,
      " holds a checkpoint written by torch.distributed.checkpoint (its "
      ".metadata is a Python pickle), which dcp does not read; convert it "
      "once: python -m dcp.format_utils torch_dcp_to_dcp ",
      id, " NEW_DIR"));
}

absl::StatusOr<Metadata> ReadCommittedMetadata(const std::string& id) {
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<StorageReader> reader,
                       StorageRegistry::Default().CreateReader(id));
  absl::StatusOr<Metadata> metadata = reader->ReadMetadata();
  if (absl::IsDataLoss(metadata.status()) && HoldsTorchDcpMetadata(id)) {
    return TorchDcpCheckpointError(id);
  }
  return metadata;
}

// The directory holding the data files of the checkpoint `id` names.
std::string DataDirectory(const std::string& id) {
  absl::StatusOr<std::string> path = MegaPathFromId(id);
  return path.ok() ? *path : id;
}

// The rank-local checkpoints `dir` holds (a save with use_collectives
// false: DIR/rank-R, one per rank, as rank 0's metadata records), or none
// when `dir` holds its own metadata or no rank-0 one.
struct RankLocalDirs {
  int world_size = 0;         // rank 0's record (1 when it cannot be read)
  std::string group_save_id;  // rank 0's record ("" when none)
  // The rank-R directories `dir` holds for R < world_size, by rank.
  std::vector<std::string> present;
  int first_missing = -1;  // the lowest rank < world_size without one
};

// `dir`'s rank-local directories; nullopt when `dir` holds no rank-local
// save (it has a .metadata, or rank-0/ has none). Lists `dir` rather than
// trusting rank 0's world size, which a damaged record may make huge.
std::optional<RankLocalDirs> RankLocalDirectories(const std::string& dir) {
  FileSystemBase& fs = LocalFileSystem();
  if (fs.Exists(JoinPath(dir, kMetadataFileName)).value_or(true)) {
    return std::nullopt;
  }
  const std::string first = RankLocalDirectory(dir, 0);
  if (!fs.Exists(JoinPath(first, kMetadataFileName)).value_or(false)) {
    return std::nullopt;
  }
  absl::StatusOr<Metadata> metadata = ReadCommittedMetadata(first);
  RankLocalDirs dirs;
  dirs.world_size = metadata.ok() && metadata->rank_local.has_value()
                        ? metadata->rank_local->world_size
                        : 1;
  if (metadata.ok() && metadata->rank_local.has_value()) {
    dirs.group_save_id = metadata->rank_local->group_save_id;
  }
  std::vector<int> ranks;
  for (const std::string& name :
       fs.ListDir(dir).value_or(std::vector<std::string>{})) {
    int rank;
    if (absl::StartsWith(name, "rank-") &&
        absl::SimpleAtoi(absl::string_view(name).substr(5), &rank) &&
        rank >= 0 && rank < dirs.world_size &&
        absl::StrCat("rank-", rank) == name) {
      ranks.push_back(rank);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    dirs.present.push_back(RankLocalDirectory(dir, ranks[r]));
    if (dirs.first_missing < 0 && ranks[r] != r) dirs.first_missing = r;
  }
  if (dirs.first_missing < 0 &&
      static_cast<int>(ranks.size()) < dirs.world_size) {
    dirs.first_missing = static_cast<int>(ranks.size());
  }
  return dirs;
}

// Runs `run` on each rank-local checkpoint of `dir` under a heading, and
// returns the first error after all ran; nullopt when `dir` holds none.
std::optional<absl::Status> ForEachRankLocal(
    const std::string& dir,
    const std::function<absl::Status(const std::string&)>& run) {
  const std::optional<RankLocalDirs> dirs = RankLocalDirectories(dir);
  if (!dirs.has_value()) return std::nullopt;
  std::printf(
      "%s holds rank-local checkpoints (saved with use_collectives=false) of "
      "%d ranks: each loads on the rank that saved it\n",
      dir.c_str(), dirs->world_size);
  absl::Status first;
  if (dirs->first_missing >= 0) {
    first = absl::DataLossError(absl::StrCat(
        dir, " holds ", dirs->present.size(), " of the ", dirs->world_size,
        " rank-local directories rank 0's record names (",
        RankLocalDirectory(dir, dirs->first_missing), " is missing)"));
    std::printf("%s\n", first.ToString().c_str());
  }
  for (const std::string& rank_dir : dirs->present) {
    std::printf("\n== %s\n", rank_dir.c_str());
    absl::Status status = RefuseSymbolicLink(LocalFileSystem(), rank_dir,
                                             "a rank-local directory");
    if (status.ok()) status = run(rank_dir);
    // Each rank commits on its own: ranks killed during a save can hold
    // checkpoints of different saves, which no load takes together.
    absl::StatusOr<Metadata> metadata =
        status.ok() ? ReadCommittedMetadata(rank_dir) : status;
    if (metadata.ok() && metadata->rank_local.has_value() &&
        metadata->rank_local->group_save_id != dirs->group_save_id) {
      status = absl::DataLossError(absl::StrCat(
          rank_dir, " holds save ", metadata->rank_local->group_save_id,
          " and rank 0 save ", dirs->group_save_id,
          ": the ranks hold different saves (a save interrupted while ranks "
          "committed), which no load takes together"));
    }
    if (!status.ok()) {
      std::printf("%s\n", status.ToString().c_str());
      if (first.ok()) first = status;
    }
  }
  return first;
}

std::string ChunkToString(const ChunkStorageMetadata& chunk) {
  return absl::StrCat("offsets ", ShapeToString(chunk.offsets), " sizes ",
                      ShapeToString(chunk.sizes));
}

// The most bytes `dcp verify` reads at once.
constexpr int64_t kVerifyPieceBytes = int64_t{4} << 20;
// The largest raw block `dcp verify` decodes (larger ones are checked by
// their checksums only).
constexpr int64_t kVerifyDecodeBytes = int64_t{256} << 20;

// Verifies one stored item against `file` (its data file, of `file_size`
// bytes): the item has one checksum per block, lies inside the file, and
// each block matches. Blocks are read in pieces of at most kVerifyPieceBytes
// into `buffer`, so memory stays bounded whatever the metadata claims.
// Returns the problems found; adds the bytes checked to `bytes_checked`.

std::vector<std::string> VerifyItem(const MetadataIndex& index,
                                    const StorageInfo& info, int64_t block,
                                    File& file, int64_t file_size,
                                    std::string& buffer,
                                    int64_t& bytes_checked) {
  // DecodeMetadata bounded block and offset + length, and checked the
  // stored block sizes of an item stored through extensions.
  const bool encoded = !info.extensions.empty();
  const int64_t expected_blocks = ChecksumBlockCount(info.RawLength(), block);
  if (static_cast<int64_t>(info.block_checksums.size()) != expected_blocks) {
    return {absl::StrCat(index.ToString(), ": metadata has ",
                         info.block_checksums.size(),
                         " block checksums, expected ", expected_blocks)};
  }
  if (info.offset + info.length > file_size) {
    return {absl::StrCat(index.ToString(), ": ", file.path(),
                         " is truncated: the item needs bytes [", info.offset,
                         ", ", info.offset + info.length,
                         "), the file ends at ", file_size)};
  }
  std::vector<std::string> problems;
  // An encoded item must decode with this build's extensions, as a load
  // would: each encoded block whose checksum matches is decoded too (up to
  // kVerifyDecodeBytes of raw bytes per block).
  std::vector<const StreamExtension*> chain;
  if (encoded) {
    absl::StatusOr<std::vector<const StreamExtension*>> resolved =
        ResolveExtensions(ExtensionRegistry::Default(), info.extensions,
                          index.ToString());
    if (!resolved.ok()) {
      return {absl::StrCat(index.ToString(),
                           ": cannot be decoded by this "
                           "build: ",
                           resolved.status().message())};
    }
    chain = *std::move(resolved);
  }
  std::string stored;
  std::vector<std::byte> raw_block;
  std::vector<std::byte> scratch;
  int64_t stored_start = 0;  // Of block b, with extensions.
  for (int64_t b = 0; b < expected_blocks; ++b) {
    const int64_t start = encoded ? stored_start : b * block;
    const int64_t size =
        encoded ? info.block_lengths[b] : std::min(block, info.length - start);
    const int64_t raw_size = std::min(block, info.RawLength() - b * block);
    const bool decode =
        encoded && size < raw_size && raw_size <= kVerifyDecodeBytes;
    stored.clear();
    stored_start += size;
    StreamingChecksum sum;
    for (int64_t done = 0; done < size;) {
      buffer.resize(std::min(kVerifyPieceBytes, size - done));
      absl::StatusOr<size_t> got = file.PRead(
          info.offset + start + done,
          {reinterpret_cast<std::byte*>(buffer.data()), buffer.size()});
      if (!got.ok() || *got != buffer.size()) {
        problems.push_back(
            absl::StrCat(index.ToString(), ": ",
                         got.ok() ? absl::StrCat(file.path(), " ended early")
                                  : std::string(got.status().message())));
        return problems;
      }
      sum.Update(buffer.data(), buffer.size());
      if (decode) stored += buffer;
      done += static_cast<int64_t>(buffer.size());
    }
    bytes_checked += size;
    if (sum.Digest() != info.block_checksums[b]) {
      problems.push_back(
          absl::StrCat(index.ToString(), ": checksum mismatch in ",
                       info.relative_path, " at offset ", info.offset + start,
                       " (block ", b, ", ", size, " bytes)"));
      continue;
    }
    if (!decode) continue;
    raw_block.resize(static_cast<size_t>(raw_size));
    absl::Status decoded = DecodeBlock(
        chain,
        {reinterpret_cast<const std::byte*>(stored.data()), stored.size()},
        absl::MakeSpan(raw_block), scratch);
    if (!decoded.ok()) {
      problems.push_back(absl::StrCat(index.ToString(), ": block ", b, " in ",
                                      info.relative_path, " at offset ",
                                      info.offset + start,
                                      " does not decode: ", decoded.message()));
    }
  }
  return problems;
}

}  // namespace

absl::Status RefuseNonCheckpointSource(const std::string& id) {
  if (absl::StrContains(id, "://")) return absl::OkStatus();
  if (HoldsTorchDcpMetadata(id)) {
    return TorchDcpCheckpointError(id);
  }
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(id, ec);
  if (ec || status.type() == std::filesystem::file_type::directory) {
    return absl::OkStatus();  // Absent: the readers say so.
  }
  const std::string name = std::filesystem::path(id).filename().string();
  if (name == kMetadataFileName || absl::EndsWith(name, ".distcp") ||
      absl::EndsWith(name, ".safetensors") || absl::EndsWith(name, ".mega") ||
      absl::EndsWith(name, ".index.json")) {
    return absl::FailedPreconditionError(
        absl::StrCat(id,
                     " is a file, not a checkpoint directory; pass the "
                     "directory that holds it"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      id,
      " is a file, not a checkpoint directory (dcp checkpoints are "
      "directories); a torch.save file converts with: python -m "
      "dcp.format_utils torch_to_dcp ",
      id, " NEW_DIR"));
}

absl::Status RunInspect(const std::string& dir) {
  DCP_RETURN_IF_ERROR(RefuseNonCheckpointSource(dir));
  if (IsHfCheckpointDirectory(dir)) return RunInspectHf(dir);
  if (std::optional<absl::Status> each = ForEachRankLocal(dir, RunInspect)) {
    return *each;
  }
  DCP_ASSIGN_OR_RETURN(Metadata metadata, ReadCommittedMetadata(dir));
  std::printf("checkpoint %s (format %s, checksum block %lld bytes)\n",
              dir.c_str(), metadata.version.c_str(),
              static_cast<long long>(metadata.checksum_block_size));
  if (metadata.storage_meta.has_value() &&
      !metadata.storage_meta->save_id.empty()) {
    std::printf("save id %s\n", metadata.storage_meta->save_id.c_str());
  }
  std::map<std::string, int64_t> file_bytes;
  // Tensors stored through extensions: their descriptors, raw and stored
  // bytes.
  struct Encoded {
    std::string extensions;
    int64_t raw = 0, stored = 0;
  };
  std::map<std::string, Encoded> encoded;
  for (const auto& [index, info] : metadata.storage_data) {
    if (!info.extensions.empty()) {
      Encoded& e = encoded[index.fqn];
      e.extensions = absl::StrJoin(info.extensions, "+");
      e.raw += info.raw_length;
      e.stored += info.length;
    }
    int64_t& total = file_bytes[info.relative_path];
    // Lengths are non-negative (DecodeMetadata); a crafted sum saturates.
    if (__builtin_add_overflow(total, info.length, &total)) total = INT64_MAX;
  }
  std::printf("\n%-48s %-6s %-20s %s\n", "key", "dtype", "shape", "chunks");
  for (const auto& [name, entry] : metadata.state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      auto e = encoded.find(name);
      std::printf(
          "%-48s %-6s %-20s %zu%s\n", name.c_str(),
          std::string(DTypeName(t->properties.dtype)).c_str(),
          ShapeToString(t->size).c_str(), t->chunks.size(),
          e == encoded.end()
              ? ""
              : absl::StrFormat("  %s ratio %.2f", e->second.extensions,
                                e->second.stored > 0
                                    ? static_cast<double>(e->second.raw) /
                                          static_cast<double>(e->second.stored)
                                    : 1.0)
                    .c_str());
      if (t->chunks.size() > 1) {
        for (const ChunkStorageMetadata& chunk : t->chunks) {
          std::printf("    %s\n", ChunkToString(chunk).c_str());
        }
      }
    } else {
      std::printf("%-48s %-6s %-20s\n", name.c_str(), "value", "-");
    }
  }
  std::printf("\n%-40s %s\n", "file", "bytes of items");
  for (const auto& [file, bytes] : file_bytes) {
    std::printf("%-40s %lld\n", file.c_str(), static_cast<long long>(bytes));
  }
  return absl::OkStatus();
}

std::vector<std::string> UncoveredTensors(const Metadata& metadata) {
  std::vector<std::string> uncovered;
  if (metadata.rank_local.has_value()) return uncovered;
  for (const auto& [name, entry] : metadata.state_dict_metadata) {
    const auto* t = std::get_if<TensorStorageMetadata>(&entry);
    if (t == nullptr) continue;
    int64_t held = 0;
    for (const ChunkStorageMetadata& chunk : t->chunks) {
      held += NumElements(chunk.sizes);
    }
    if (held != NumElements(t->size)) {
      uncovered.push_back(
          absl::StrCat("tensor ", name, " has shape ", ShapeToString(t->size),
                       " but its chunks hold ", held, " of its ",
                       NumElements(t->size), " elements"));
    }
  }
  return uncovered;
}

absl::Status RunVerify(const std::string& id) {
  DCP_RETURN_IF_ERROR(RefuseNonCheckpointSource(id));
  if (IsHfCheckpointDirectory(id)) return RunVerifyHf(id);
  if (std::optional<absl::Status> each = ForEachRankLocal(id, RunVerify)) {
    return *each;
  }
  DCP_ASSIGN_OR_RETURN(Metadata metadata, ReadCommittedMetadata(id));
  const std::string dir = DataDirectory(id);
  std::vector<std::string> problems = UncoveredTensors(metadata);
  // Files this process may not read: their bytes are unchecked, not bad.
  std::vector<std::string> unreadable;
  int64_t items = 0, bytes = 0;
  std::string buffer;
  // File by file, each opened once: a regular file inside the directory
  // (the decoder checked the names; no symbolic link is followed).
  std::map<std::string,
           std::vector<const std::pair<const MetadataIndex, StorageInfo>*>>
      by_file;
  for (const auto& entry : metadata.storage_data) {
    by_file[entry.second.relative_path].push_back(&entry);
  }
  OpenOptions open_options;
  open_options.exclusive = false;
  open_options.no_follow = true;
  for (const auto& [name, entries] : by_file) {
    items += static_cast<int64_t>(entries.size());
    absl::StatusOr<std::unique_ptr<File>> file =
        LocalFileSystem().OpenForRead(JoinPath(dir, name), open_options);
    absl::StatusOr<int64_t> size =
        file.ok() ? (*file)->Size() : absl::StatusOr<int64_t>(file.status());
    if (absl::IsPermissionDenied(size.status())) {
      unreadable.push_back(JoinPath(dir, name));
      continue;
    }
    if (!size.ok()) {
      for (const auto* entry : entries) {
        problems.push_back(absl::StrCat(entry->first.ToString(), ": ",
                                        size.status().message()));
      }
      continue;
    }
    for (const auto* entry : entries) {
      for (std::string& problem :
           VerifyItem(entry->first, entry->second, metadata.checksum_block_size,
                      **file, *size, buffer, bytes)) {
        problems.push_back(std::move(problem));
      }
    }
  }
  if (!problems.empty()) {
    // Files a save committed meanwhile took away are no damage.
    absl::StatusOr<Metadata> now = ReadCommittedMetadata(id);
    if (!now.ok() || !(*now == metadata)) {
      return absl::AbortedError(absl::StrCat(
          "the checkpoint in ", dir,
          now.ok() ? " was replaced by another save" : " was removed",
          " while verify read it (", problems.front(), "); run verify again"));
    }
  }
  for (const std::string& p : problems) std::printf("BAD  %s\n", p.c_str());
  for (const std::string& u : unreadable) {
    std::printf("UNREADABLE %s (permission denied: not checked)\n", u.c_str());
  }
  std::printf(
      "%s: %lld items, %lld bytes checked, %zu problems%s\n",
      !problems.empty()    ? "CORRUPT"
      : unreadable.empty() ? "OK"
                           : "UNCHECKED",
      static_cast<long long>(items), static_cast<long long>(bytes),
      problems.size(),
      unreadable.empty()
          ? ""
          : absl::StrCat(", ", unreadable.size(), " unreadable files").c_str());
  // Data files no committed metadata names: left by interrupted saves (or
  // being written by a save running now).
  int64_t orphans = 0, orphan_bytes = 0;
  for (const std::string& name :
       LocalFileSystem().ListDir(dir).value_or(std::vector<std::string>{})) {
    if (IsWriterFileName(name) && by_file.count(name) == 0) {
      ++orphans;
      std::error_code ec;
      const uintmax_t size =
          std::filesystem::file_size(JoinPath(dir, name), ec);
      if (!ec) orphan_bytes += static_cast<int64_t>(size);
    }
  }
  if (orphans > 0) {
    std::printf(
        "NOTE: %lld files (%lld bytes) that the checkpoint does not use, "
        "left by saves that did not finish (or being written by one now); "
        "`dcp verify --clean %s` removes them\n",
        static_cast<long long>(orphans), static_cast<long long>(orphan_bytes),
        dir.c_str());
  }
  if (problems.empty() && !unreadable.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint ", dir, " could not be verified: ", unreadable.front(),
        unreadable.size() > 1
            ? absl::StrCat(" (and ", unreadable.size() - 1, " more files)")
            : "",
        " cannot be read (permission denied)"));
  }
  if (!problems.empty()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", dir, " failed verification: ", problems.front(),
        problems.size() > 1
            ? absl::StrCat(" (and ", problems.size() - 1, " more)")
            : ""));
  }
  return absl::OkStatus();
}

absl::Status RunClean(const std::string& dir) {
  DCP_RETURN_IF_ERROR(RefuseNonCheckpointSource(dir));
  FileSystemBase& fs = LocalFileSystem();
  // The saves' own lock: an orphan cannot be told from a file a save
  // running now is writing, so a running save makes this fail, naming it.
  DCP_ASSIGN_OR_RETURN(
      std::unique_ptr<DirectoryLock> lock,
      fs.LockDirectory(
          dir, absl::StrCat(ThisProcessDescription(), " (dcp verify --clean)"),
          LockMode::kExclusive));
  const OrphanCleanup cleanup = RemoveOrphans(fs, dir);
  for (const std::string& name : cleanup.removed) {
    std::printf("REMOVED  %s\n", name.c_str());
  }
  for (const std::string& name : cleanup.left) {
    std::printf("LEFT     %s\n", name.c_str());
  }
  std::printf("cleaned %s: %zu orphaned files removed, %lld bytes reclaimed",
              dir.c_str(), cleanup.removed.size(),
              static_cast<long long>(cleanup.removed_bytes));
  if (!cleanup.left.empty()) {
    std::printf("; %zu left (%lld bytes)", cleanup.left.size(),
                static_cast<long long>(cleanup.left_bytes));
  }
  std::printf("\n");
  if (!cleanup.status.ok()) {
    return absl::Status(cleanup.status.code(), cleanup.Summary(dir));
  }
  return absl::OkStatus();
}

}  // namespace dcp
