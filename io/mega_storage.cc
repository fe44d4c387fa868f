#include "io/mega_storage.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/checksum.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/checkpoint_formats.h"
#include "io/internal/commit_journal.h"
#include "io/internal/journaled_writer.h"
#include "io/internal/parallel_work.h"
#include "io/internal/sequential_writer.h"
#include "io/internal/storage_resources.h"
#include "io/mega_format.h"
#include "nlohmann/json.hpp"
#include "planner/chunk_geometry.h"
#include "planner/plan_cache.h"
#include "staging/device_staging.h"

namespace dcp {

using internal_io::AlignedBuffer;
using internal_io::CommitJournal;
using internal_io::CompleteCommit;
using internal_io::IsTemporaryFileName;
using internal_io::OrLocal;
using internal_io::ReadSmallFile;
using internal_io::TempRelativePath;
using internal_io::WriteSmallFile;
using Json = nlohmann::json;

namespace {

// What a MEGA directory holds names in, for CheckUtf8Names.
constexpr char kMegaNamesHeldBy[] =
    "a MEGA checkpoint (JSON headers and index)";

bool IsMegaFile(absl::string_view relative) {
  return IsMegaCheckpointFileName(relative);
}

// The plan's storage_data: the coordinator's save id and, per file this
// rank writes, its name and the values in it.
struct RankFiles {
  std::string save_id;
  std::map<std::string, std::vector<std::string>> files;
};

int FileIndexOf(const std::map<std::string, int>& mapping,
                const std::string& fqn) {
  auto it = mapping.find(fqn);
  return it == mapping.end() ? 1 : it->second;
}

const std::byte kZeros[kMegaAlignment] = {};

}  // namespace

absl::StatusOr<std::string> MegaPathFromId(absl::string_view id) {
  const size_t colon = id.find("://");
  if (colon == absl::string_view::npos) return std::string(id);
  const absl::string_view scheme = id.substr(0, colon);
  if (scheme != kMegaScheme) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", id, "\" is not a MEGA location (a directory or mega://DIR)"));
  }
  absl::string_view rest = id.substr(colon + 3);
  if (rest.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", id,
                     "\" names no directory (mega:///abs/dir or "
                     "mega://rel/dir)"));
  }
  return std::string(rest);
}

// ---------------------------------------------------------------------------
// MegaStorageWriter

struct MegaStorageWriter::FileWork {
  std::string name;
  std::vector<const WriteItem*> items;
  std::vector<WriteResult*> results;
};

MegaStorageWriter::MegaStorageWriter(std::string path,
                                     MegaStorageWriterOptions options)
    : JournaledStorageWriter(path, internal_io::JournaledOptionsOf(options)),
      options_(std::move(options)) {
  absl::StatusOr<std::string> dir = MegaPathFromId(path);
  if (dir.ok()) path_ = *std::move(dir);
  path_error_ = dir.status();
  options_.thread_count = std::max(1, options_.thread_count);
}

MegaStorageWriter::~MegaStorageWriter() = default;

absl::Status MegaStorageWriter::Reset(const std::string& checkpoint_id) {
  if (!checkpoint_id.empty()) {
    DCP_ASSIGN_OR_RETURN(path_, MegaPathFromId(checkpoint_id));
    path_error_ = absl::OkStatus();
  }
  StartSave();
  weight_map_.clear();
  total_size_ = 0;
  return absl::OkStatus();
}

absl::Status MegaStorageWriter::CompleteCommitOnDisk() {
  return CompleteCommit(*fs_, path_, kMegaCommitJournalName, IsMegaFile,
                        options_.sync_files);
}

absl::Status MegaStorageWriter::SetUp(bool is_coordinator, int rank,
                                      bool /*use_collectives*/) {
  DCP_RETURN_IF_ERROR(path_error_);
  DCP_RETURN_IF_ERROR(engine_error_);
  rank_ = rank;
  // Every rank, before it creates anything (the coordinator checks again
  // under the lock).
  DCP_RETURN_IF_ERROR(RefuseOtherFormats(*fs_, path_, CheckpointFormat::kMega,
                                         /*list=*/false));
  DCP_RETURN_IF_ERROR(Annotate(
      fs_->CreateDir(path_),
      absl::StrCat("rank ", rank, ": cannot create MEGA directory ", path_)));
  if (!is_coordinator) return absl::OkStatus();
  DCP_RETURN_IF_ERROR(LockAndRecover("MEGA directory"));
  // The files this save replaces: a directory that cannot be listed fails
  // the save (taken for empty, the old files would outlive the commit).
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(path_);
  if (!names.ok()) {
    return Annotate(names.status(),
                    absl::StrCat("rank ", rank, ": cannot list MEGA directory ",
                                 path_, " (the files this save replaces)"));
  }
  for (const std::string& name : *names) {
    if (IsTemporaryFileName(name)) {
      fs_->RemoveFile(JoinPath(path_, name)).IgnoreError();
    } else if (IsMegaCheckpointFileName(name)) {
      replaced_.insert(name);
    }
  }
  return RefuseOtherFormats(*fs_, path_, CheckpointFormat::kMega);
}

absl::StatusOr<SavePlan> MegaStorageWriter::PrepareLocalPlan(SavePlan plan) {
  MegaHeader probe;
  probe.checksum_block_size = options_.checksum_block_size;
  DCP_RETURN_IF_ERROR(LayOutMegaFile(probe));
  DCP_RETURN_IF_ERROR(internal_io::CheckUtf8Names(plan, kMegaNamesHeldBy));
  const auto& mapping = options_.fqn_to_index_mapping;
  if (mapping.empty()) return plan;
  for (const WriteItem& item : plan.items) {
    auto it = mapping.find(item.index.fqn);
    if (it == mapping.end() || it->second < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fqn_to_index_mapping ",
          it == mapping.end() ? "has no file for \"" : "maps below 1 \"",
          item.index.fqn, "\""));
    }
  }
  return plan;
}

absl::StatusOr<std::vector<SavePlan>> MegaStorageWriter::PrepareGlobalPlan(
    std::vector<SavePlan> plans) {
  DCP_ASSIGN_OR_RETURN(
      std::vector<PlannedItems> items,
      PlannedItemsOf(plans, "MegaStorageWriter", kMegaNamesHeldBy));
  // (file index, rank) pairs that hold values: each becomes one file.
  std::map<std::pair<int, size_t>, std::string> names;
  for (size_t r = 0; r < items.size(); ++r) {
    for (const auto& [fqn, bytes] : items[r]) {
      names[{FileIndexOf(options_.fqn_to_index_mapping, fqn), r}];
    }
  }
  int highest = 1;
  for (const auto& [fqn, index] : options_.fqn_to_index_mapping) {
    highest = std::max(highest, index);
  }
  std::set<int> indices;
  for (const auto& [key, name] : names) indices.insert(key.first);
  const bool renumber = indices.size() != names.size();
  const int count = renumber ? static_cast<int>(names.size()) : highest;
  int k = 0;
  for (auto& [key, name] : names) {
    name = MegaFileName(renumber ? ++k : key.first, count);
  }
  weight_map_.clear();
  total_size_ = 0;
  for (size_t r = 0; r < plans.size(); ++r) {
    RankFiles files{save_id_, {}};
    for (const auto& [fqn, bytes] : items[r]) {
      const std::string& name =
          names[{FileIndexOf(options_.fqn_to_index_mapping, fqn), r}];
      std::vector<std::string>& in_file = files.files[name];
      if (std::find(in_file.begin(), in_file.end(), fqn) == in_file.end()) {
        in_file.push_back(fqn);
      }
      weight_map_[fqn].insert(name);
      total_size_ += bytes;
    }
    plans[r].storage_data =
        Json{{"save_id", files.save_id}, {"files", files.files}}.dump();
  }
  return plans;
}

absl::Status MegaStorageWriter::WriteFile(FileWork& work,
                                          SavePlanner& planner) {
  const std::string where = absl::StrCat("rank ", rank_);
  const size_t n = work.items.size();
  // Resolve every value and lay the file out.
  std::vector<dcp::WriteValue> data(n);
  MegaHeader header;
  header.checksum_block_size = options_.checksum_block_size;
  header.entries.resize(n);
  bool on_device = false;
  for (size_t i = 0; i < n; ++i) {
    const WriteItem& item = *work.items[i];
    absl::StatusOr<dcp::WriteValue> resolved = planner.ResolveData(item);
    if (!resolved.ok()) {
      return Annotate(resolved.status(), absl::StrCat(where, ": resolving ",
                                                      item.index.ToString()));
    }
    data[i] = *std::move(resolved);
    MegaEntry& e = header.entries[i];
    e.name = item.index.fqn;
    if (const Tensor* t = std::get_if<Tensor>(&data[i])) {
      if (!item.tensor_data.has_value() || !t->view().is_contiguous() ||
          static_cast<int64_t>(t->nbytes()) != item.StorageBytes()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", item.index.ToString(),
                         " did not resolve to a contiguous tensor of ",
                         item.StorageBytes(), " bytes"));
      }
      const TensorWriteData& td = *item.tensor_data;
      e.dtype = t->dtype();
      e.shape = td.size;
      e.offsets = td.chunk.offsets;
      e.sizes = td.chunk.sizes;
      e.requires_grad = td.properties.requires_grad;
      e.length = static_cast<int64_t>(t->nbytes());
      on_device = on_device || !t->device().is_cpu();
    } else {
      e.is_tensor = false;
      e.length = static_cast<int64_t>(std::get<std::string>(data[i]).size());
    }
  }
  DCP_RETURN_IF_ERROR(LayOutMegaFile(header));
  // The header goes first with zero checksums and is rewritten once the
  // data (and so the checksums) are known; its size does not change.
  const std::string placeholder = EncodeMegaHeader(header);

  const std::string path = TempPath(work.name);
  absl::StatusOr<std::unique_ptr<File>> opened = CreateTempFile(path);
  if (!opened.ok()) return Annotate(opened.status(), where);
  std::unique_ptr<File> file = *std::move(opened);
  absl::Status status;
  if (file->direct()) status = file->Preallocate(header.file_size);
  std::vector<BlockChecksummer> sums;
  sums.reserve(n);
  for (size_t i = 0; i < n; ++i) sums.emplace_back(header.checksum_block_size);
  if (status.ok()) {
    internal_io::SequentialWriter writer(*engine_, *file, WriterOptions(*file));
    // Zero padding up to entry i's start.
    auto pad_to = [&](size_t i) {
      const int64_t gap =
          header.data_start + header.entries[i].begin - writer.position();
      return gap > 0 ? writer.Append(kZeros, gap) : absl::OkStatus();
    };
    status =
        writer.Append(reinterpret_cast<const std::byte*>(placeholder.data()),
                      static_cast<int64_t>(placeholder.size()));
    if (!on_device) {
      std::vector<const std::byte*> bytes(n);
      for (size_t i = 0; i < n; ++i) {
        if (const Tensor* t = std::get_if<Tensor>(&data[i])) {
          bytes[i] = static_cast<const std::byte*>(t->data());
        } else {
          bytes[i] = reinterpret_cast<const std::byte*>(
              std::get<std::string>(data[i]).data());
        }
      }
      // Host memory stays as it is: its checksums are computed on a thread
      // of their own while the writes are issued.
      std::thread hasher([&] {
        for (size_t i = 0; i < n; ++i) {
          sums[i].Update(bytes[i], header.entries[i].length);
        }
      });
      for (size_t i = 0; i < n && status.ok(); ++i) {
        status = pad_to(i);
        if (status.ok()) {
          status = writer.Append(bytes[i], header.entries[i].length);
        }
      }
      hasher.join();
    } else if (status.ok()) {
      // Every value goes through the staging pool in file order; each
      // piece is written from its pinned chunk, which returns to the pool
      // once written.
      std::vector<Tensor> staged_tensors(n);
      std::vector<PipelineItem> staged;
      for (size_t i = 0; i < n; ++i) {
        if (const Tensor* t = std::get_if<Tensor>(&data[i])) {
          staged_tensors[i] = *t;
        } else {
          const std::string& s = std::get<std::string>(data[i]);
          staged_tensors[i] =
              Tensor::Empty(DType::kU8, {static_cast<int64_t>(s.size())});
          std::memcpy(staged_tensors[i].data(), s.data(), s.size());
        }
        staged.push_back({staged_tensors[i].view(), i, header.entries[i].name});
      }
      status = StageAndAppend(staged, writer,
                              [&](size_t i, const std::byte* bytes,
                                  int64_t length) -> absl::Status {
                                DCP_RETURN_IF_ERROR(pad_to(i));
                                sums[i].Update(bytes, length);
                                return absl::OkStatus();
                              });
    }
    absl::Status finished = writer.Finish();
    status.Update(finished);
  }
  if (status.ok()) {
    for (size_t i = 0; i < n; ++i) {
      header.entries[i].checksums = sums[i].Finish();
    }
    const std::string final_header = EncodeMegaHeader(header);
    AlignedBuffer buffer(final_header.size());
    std::memcpy(buffer.data, final_header.data(), final_header.size());
    status = file->PWrite(0, {buffer.data, final_header.size()});
  }
  if (status.ok() && options_.sync_files) status = file->Sync();
  absl::Status closed = file->Close();
  status.Update(closed);
  if (!status.ok()) {
    return Annotate(status, absl::StrCat(where, ": writing ", path));
  }
  for (size_t i = 0; i < n; ++i) {
    const MegaEntry& e = header.entries[i];
    WriteResult& result = *work.results[i];
    result.index = work.items[i]->index;
    result.size_in_bytes = e.length;
    result.storage_data.relative_path = work.name;
    result.storage_data.offset = header.data_start + e.begin;
    result.storage_data.length = e.length;
    result.storage_data.block_checksums = e.checksums;
  }
  return absl::OkStatus();
}

Future<std::vector<WriteResult>> MegaStorageWriter::WriteData(
    const SavePlan& plan, SavePlanner& planner) {
  using Result = Future<std::vector<WriteResult>>;
  absl::StatusOr<std::string> storage_data = StorageDataOf(plan);
  if (!storage_data.ok()) return Result::Ready(storage_data.status());
  RankFiles rank_files;
  try {
    const Json json = Json::parse(*storage_data);
    rank_files.save_id = json.at("save_id").get<std::string>();
    rank_files.files =
        json.at("files").get<std::map<std::string, std::vector<std::string>>>();
  } catch (const std::exception& e) {
    return Result::Ready(absl::InternalError(
        absl::StrCat("malformed storage_data in a save plan: ", e.what())));
  }
  // Temporary names carry the coordinator's save id: its Finish renames
  // every rank's files.
  save_id_ = rank_files.save_id;
  std::vector<FileWork> work;
  std::map<std::string, size_t> file_of;
  for (const auto& [name, fqns] : rank_files.files) {
    if (!IsMegaCheckpointFileName(name) || name == kMegaIndexFileName) {
      return Result::Ready(absl::InternalError(
          absl::StrCat("save plan names the file \"", name, "\"")));
    }
    for (const std::string& fqn : fqns) file_of[fqn] = work.size();
    work.push_back(FileWork{name, {}, {}});
  }
  std::vector<WriteResult> results(plan.items.size());
  for (size_t i = 0; i < plan.items.size(); ++i) {
    auto it = file_of.find(plan.items[i].index.fqn);
    if (it == file_of.end()) {
      return Result::Ready(absl::InternalError(absl::StrCat(
          "the save plan gives ", plan.items[i].index.ToString(), " no file")));
    }
    work[it->second].items.push_back(&plan.items[i]);
    work[it->second].results.push_back(&results[i]);
  }
  absl::Status status = WriteFiles(
      work.size(), options_.thread_count,
      [&](size_t f) { return WriteFile(work[f], planner); }, path_);
  if (!status.ok()) return Result::Ready(status);
  return Result::Ready(std::move(results));
}

absl::Status MegaStorageWriter::Finish(
    const Metadata& /*metadata*/,
    const std::vector<std::vector<WriteResult>>& results) {
  // The index must name exactly the values written where they were written
  // (a cached plan other than the one this writer saw would differ).
  MegaIndex index;
  index.total_size = total_size_;
  std::map<std::string, std::set<std::string>> written;
  std::set<std::string> files;
  for (const std::vector<WriteResult>& rank : results) {
    for (const WriteResult& result : rank) {
      written[result.index.fqn].insert(result.storage_data.relative_path);
      files.insert(result.storage_data.relative_path);
    }
  }
  if (written != weight_map_) {
    return absl::InternalError(
        "the values written are not those the planned index names");
  }
  index.files.assign(files.begin(), files.end());
  for (const auto& [fqn, in] : written) {
    index.weight_map[fqn].assign(in.begin(), in.end());
  }
  CommitJournal journal;
  for (const std::string& name : files) {
    journal.renames.emplace_back(TempRelativePath(name, save_id_), name);
  }
  const std::string temp_index = TempPath(kMegaIndexFileName);
  commit_->RecordCreated(temp_index);
  DCP_RETURN_IF_ERROR(WriteSmallFile(*fs_, temp_index, EncodeMegaIndex(index),
                                     options_.sync_files));
  journal.renames.emplace_back(TempRelativePath(kMegaIndexFileName, save_id_),
                               kMegaIndexFileName);
  for (const std::string& name : replaced_) {
    if (!files.contains(name) && name != kMegaIndexFileName) {
      journal.removals.push_back(name);
    }
  }
  // The decision: once the journal is durable under its name, the save
  // completes whatever happens next.
  return CommitSave(kMegaCommitJournalName, TempPath(kMegaCommitJournalName),
                    journal);
}

// ---------------------------------------------------------------------------
// MegaStorageReader

namespace {

// A tensor chunk a file's header holds.
struct FoundChunk {
  std::string path;  // The file, for messages.
  ChunkStorageMetadata chunk;
  StorageInfo info;
};

// Adds the entries of `file` (header `header`) to `metadata`: non-tensor
// values, and each tensor with its dtype and shape; its chunks go to
// `chunks` (AddChunks adds them). `seen` maps each value to the files its
// entries were found in.
absl::Status AddEntries(const std::string& file, const std::string& path,
                        const MegaHeader& header, Metadata& metadata,
                        std::map<std::string, std::vector<FoundChunk>>& chunks,
                        std::map<std::string, std::set<std::string>>& seen) {
  for (const MegaEntry& e : header.entries) {
    seen[e.name].insert(file);
    StorageInfo info{file, header.data_start + e.begin, e.length, e.checksums};
    auto [it, inserted] = metadata.state_dict_metadata.try_emplace(
        e.name, e.is_tensor ? StorageMetadata(TensorStorageMetadata{})
                            : StorageMetadata(BytesStorageMetadata{}));
    auto* tensor = std::get_if<TensorStorageMetadata>(&it->second);
    if ((tensor != nullptr) != e.is_tensor) {
      return absl::DataLossError(
          absl::StrCat(path, ": \"", e.name,
                       "\" is a tensor in one file and a non-tensor "
                       "value in another"));
    }
    if (!e.is_tensor) {
      if (!inserted) {
        return absl::DataLossError(
            absl::StrCat(path, ": the value \"", e.name, "\" is stored twice"));
      }
      metadata.storage_data[MetadataIndex(e.name)] = std::move(info);
      continue;
    }
    if (inserted) {
      tensor->properties.dtype = e.dtype;
      tensor->properties.requires_grad = e.requires_grad;
      tensor->size = e.shape;
    } else if (tensor->properties.dtype != e.dtype || tensor->size != e.shape) {
      return absl::DataLossError(
          absl::StrCat(path, ": a chunk of tensor \"", e.name, "\" is ",
                       DTypeName(e.dtype), " ", ShapeToString(e.shape),
                       ", another ", DTypeName(tensor->properties.dtype), " ",
                       ShapeToString(tensor->size)));
    }
    chunks[e.name].push_back({path, {e.offsets, e.sizes}, std::move(info)});
  }
  return absl::OkStatus();
}

// Adds each tensor's chunks to `metadata` (its chunks and storage_data,
// which is keyed by name and offsets). Chunks without elements (a rank
// that held none of a dimension) are dropped when the tensor has other
// chunks, as the Hugging Face reader does: one may share its offsets with
// a real chunk, whose storage record it would replace. kDataLoss naming
// both files for two remaining chunks at the same offsets.
absl::Status AddChunks(std::map<std::string, std::vector<FoundChunk>>& chunks,
                       Metadata& metadata) {
  for (auto& [name, found] : chunks) {
    auto& tensor =
        std::get<TensorStorageMetadata>(metadata.state_dict_metadata[name]);
    if (found.size() > 1) {
      std::vector<FoundChunk> kept;
      for (FoundChunk& c : found) {
        if (NumElements(c.chunk.sizes) > 0) kept.push_back(std::move(c));
      }
      // A tensor without elements keeps one of its (empty) chunks.
      if (kept.empty()) kept.push_back(std::move(found.front()));
      found = std::move(kept);
    }
    std::map<Shape, const std::string*> path_at;
    for (FoundChunk& c : found) {
      auto [at, inserted] = path_at.try_emplace(c.chunk.offsets, &c.path);
      if (!inserted) {
        return absl::DataLossError(absl::StrCat(
            *at->second, " and ", c.path, " both hold the chunk of tensor \"",
            name, "\" at ", ShapeToString(c.chunk.offsets)));
      }
      const int64_t position = static_cast<int64_t>(tensor.chunks.size());
      metadata.storage_data[MetadataIndex(name, c.chunk.offsets, position)] =
          std::move(c.info);
      tensor.chunks.push_back(std::move(c.chunk));
    }
  }
  return absl::OkStatus();
}

// The chunks of every tensor cover it exactly once.
absl::Status CheckCoverage(const Metadata& metadata, const std::string& dir) {
  for (const auto& [name, value] : metadata.state_dict_metadata) {
    const auto* tensor = std::get_if<TensorStorageMetadata>(&value);
    if (tensor == nullptr) continue;
    absl::Status tiled =
        ValidateTiling(name, tensor->size, tensor->chunks, [&](size_t i) {
          return absl::StrCat("at ", ShapeToString(tensor->chunks[i].offsets));
        });
    if (!tiled.ok()) {
      return absl::DataLossError(absl::StrCat(dir, ": ", tiled.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

MegaStorageReader::MegaStorageReader(std::string path,
                                     MegaStorageReaderOptions options)
    : options_(options), delegate_("", options) {
  delegate_.SetMetadataSource([this] { return ReadMetadata(); });
  absl::StatusOr<std::string> dir = MegaPathFromId(path);
  path_ = dir.ok() ? *dir : path;
  path_error_ = dir.status();
}

MegaStorageReader::~MegaStorageReader() = default;

absl::Status MegaStorageReader::Reset(const std::string& checkpoint_id) {
  if (!checkpoint_id.empty()) {
    DCP_ASSIGN_OR_RETURN(path_, MegaPathFromId(checkpoint_id));
    path_error_ = absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::StatusOr<Metadata> MegaStorageReader::ReadMetadata() {
  return internal_io::DescribeWhileCommitsMayRun(
      [this] { return DescribeFiles(); });
}

absl::StatusOr<Metadata> MegaStorageReader::DescribeFiles() {
  DCP_RETURN_IF_ERROR(path_error_);
  FileSystemBase& fs = *OrLocal(options_.file_system);
  DCP_RETURN_IF_ERROR(internal_io::CompletePendingCommitForRead(
      fs, path_, kMegaCommitJournalName, IsMegaFile));
  const std::string index_path = JoinPath(path_, kMegaIndexFileName);
  absl::StatusOr<std::string> text =
      ReadSmallFile(fs, index_path, kMegaMaxHeaderBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat("no MEGA checkpoint in ", path_,
                                            " (no ", kMegaIndexFileName, ")"));
  }
  if (!text.ok()) return text.status();
  DCP_ASSIGN_OR_RETURN(MegaIndex index, DecodeMegaIndex(*text, index_path));
  Metadata metadata;
  metadata.version = kFormatVersion;
  std::map<std::string, std::set<std::string>> seen;
  std::map<std::string, std::vector<FoundChunk>> chunks;
  std::optional<int64_t> block;
  OpenOptions open_options;
  open_options.exclusive = false;
  open_options.no_follow = true;
  for (const std::string& name : index.files) {
    const std::string path = JoinPath(path_, name);
    absl::StatusOr<std::unique_ptr<File>> file =
        fs.OpenForRead(path, open_options);
    if (absl::IsNotFound(file.status())) {
      return absl::DataLossError(absl::StrCat(
          index_path, " lists ", name, ", which is not in the directory"));
    }
    if (!file.ok()) return file.status();
    DCP_ASSIGN_OR_RETURN(MegaHeader header, ReadMegaHeader(**file, path));
    DCP_RETURN_IF_ERROR((*file)->Close());
    if (block.has_value() && *block != header.checksum_block_size) {
      return absl::DataLossError(absl::StrCat(
          path, " has checksum blocks of ", header.checksum_block_size,
          " bytes, other files of ", path_, " of ", *block));
    }
    block = header.checksum_block_size;
    DCP_RETURN_IF_ERROR(AddEntries(name, path, header, metadata, chunks, seen));
  }
  DCP_RETURN_IF_ERROR(AddChunks(chunks, metadata));
  if (block.has_value()) metadata.checksum_block_size = *block;
  // The index names exactly the files each value's entries are in.
  for (const auto& [fqn, files] : seen) {
    auto it = index.weight_map.find(fqn);
    const std::set<std::string> listed =
        it == index.weight_map.end()
            ? std::set<std::string>()
            : std::set<std::string>(it->second.begin(), it->second.end());
    for (const std::string& file : files) {
      if (!listed.contains(file)) {
        return absl::DataLossError(
            absl::StrCat(index_path, " does not map \"", fqn, "\" to ", file,
                         ", which holds it (a wrong index)"));
      }
    }
    if (listed.size() != files.size()) {
      for (const std::string& file : listed) {
        if (!files.contains(file)) {
          return absl::DataLossError(
              absl::StrCat(index_path, " maps \"", fqn, "\" to ", file,
                           ", which does not hold it (a wrong index)"));
        }
      }
    }
  }
  for (const auto& [fqn, files] : index.weight_map) {
    if (!seen.contains(fqn)) {
      return absl::DataLossError(
          absl::StrCat(index_path, " maps \"", fqn, "\" to ", files.front(),
                       ", which does not hold it (a wrong index)"));
    }
  }
  DCP_RETURN_IF_ERROR(CheckCoverage(metadata, path_));
  StorageMeta meta;
  meta.checkpoint_id = path_;
  metadata.storage_meta = meta;
  return metadata;
}

absl::Status MegaStorageReader::SetUp(const Metadata& metadata,
                                      bool is_coordinator) {
  DCP_RETURN_IF_ERROR(path_error_);
  DCP_RETURN_IF_ERROR(delegate_.Reset(path_));
  return delegate_.SetUp(metadata, is_coordinator);
}

absl::StatusOr<LoadPlan> MegaStorageReader::PrepareLocalPlan(LoadPlan plan) {
  return plan;
}

absl::StatusOr<std::vector<LoadPlan>> MegaStorageReader::PrepareGlobalPlan(
    std::vector<LoadPlan> plans) {
  return plans;
}

Future<void> MegaStorageReader::ReadData(const LoadPlan& plan,
                                         LoadPlanner& planner) {
  return delegate_.ReadData(plan, planner);
}

}  // namespace dcp
