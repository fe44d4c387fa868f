#include "io/hf_storage.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/internal/commit_journal.h"
#include "io/internal/hf_internal.h"
#include "io/internal/journaled_writer.h"
#include "io/internal/sequential_writer.h"
#include "io/safetensors.h"
#include "nlohmann/json.hpp"
#include "planner/plan_cache.h"
#include "staging/device_box_upload.h"
#include "staging/device_staging.h"

namespace dcp {

using internal_hf::CheckRelativePath;
using internal_hf::RemoveTemporaryFiles;
using internal_hf::ReplaceableFiles;
using internal_hf::RollForward;
using internal_io::TempRelativePath;
using internal_io::WriteSmallFile;
using Json = nlohmann::json;

namespace {

// Every file's data section starts at a multiple of this (the header is
// padded with spaces): O_DIRECT reads and writes of tensors need no bounce.
constexpr int64_t kDataAlignment = internal_io::kDirectIoAlignment;

// What a Hugging Face directory holds names in, for CheckUtf8Names.
constexpr char kHfNamesHeldBy[] =
    "a Hugging Face checkpoint (safetensors headers, JSON index)";

// Where a rank's files of a save go, relative to the directory, as a
// prefix: "sharded/" when a distributed save is consolidated (the shards
// are its sources), else the directory itself, as PyTorch's writer does
// (its reader, and transformers, find the shards there).
std::string ShardPrefix(const HuggingFaceStorageWriterOptions& options) {
  return options.save_distributed && options.enable_consolidation
             ? absl::StrCat(kHfShardedDirName, "/")
             : std::string();
}

// The directory ShardPrefix names, under `dir`.
std::string ShardDir(const std::string& dir,
                     const HuggingFaceStorageWriterOptions& options) {
  return ShardPrefix(options).empty() ? dir : JoinPath(dir, kHfShardedDirName);
}

}  // namespace

// ---------------------------------------------------------------------------
// HuggingFaceStorageWriter

// Which file a rank writes: its final name (relative to the directory).
struct HuggingFaceStorageWriter::FileAssignment {
  std::string relative;
  bool sharded = false;
};

namespace {

// The plan's storage_data: the coordinator's save id (temporary names), the
// files this rank writes and which file each of its tensors goes to.
struct RankFiles {
  std::string save_id;
  std::vector<std::string> files;
  std::map<std::string, int> file_of;
};

std::string EncodeRankFiles(const RankFiles& r) {
  return Json{
      {"save_id", r.save_id}, {"files", r.files}, {"file_of", r.file_of}}
      .dump();
}

absl::StatusOr<RankFiles> DecodeRankFiles(const std::string& text) {
  RankFiles r;
  try {
    Json json = Json::parse(text);
    r.save_id = json.at("save_id").get<std::string>();
    r.files = json.at("files").get<std::vector<std::string>>();
    r.file_of = json.at("file_of").get<std::map<std::string, int>>();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("malformed storage_data in a save plan: ", e.what()));
  }
  return r;
}

int MappedIndex(const std::map<std::string, int>& mapping,
                const std::string& fqn) {
  if (mapping.empty()) return 1;
  auto it = mapping.find(fqn);
  return it == mapping.end() ? 1 : it->second;
}

int HighestIndex(const std::map<std::string, int>& mapping) {
  int highest = 1;
  for (const auto& [fqn, index] : mapping) highest = std::max(highest, index);
  return highest;
}

}  // namespace

HuggingFaceStorageWriter::HuggingFaceStorageWriter(
    std::string path, HuggingFaceStorageWriterOptions options)
    : JournaledStorageWriter(std::move(path),
                             internal_io::JournaledOptionsOf(options)),
      options_(std::move(options)) {
  options_.thread_count = std::max(1, options_.thread_count);
  options_.thread_count_consolidation =
      std::max(1, options_.thread_count_consolidation);
}

HuggingFaceStorageWriter::~HuggingFaceStorageWriter() = default;

absl::Status HuggingFaceStorageWriter::Reset(const std::string& checkpoint_id) {
  if (!checkpoint_id.empty()) path_ = checkpoint_id;
  StartSave();
  weight_map_.clear();
  total_size_ = 0;
  return absl::OkStatus();
}

absl::Status HuggingFaceStorageWriter::CompleteCommitOnDisk() {
  return RollForward(*fs_, path_, options_.sync_files);
}

absl::Status HuggingFaceStorageWriter::SetUp(bool is_coordinator, int rank,
                                             bool /*use_collectives*/) {
  DCP_RETURN_IF_ERROR(engine_error_);
  is_coordinator_ = is_coordinator;
  rank_ = rank;
  const std::string where = absl::StrCat("rank ", rank);
  // Every rank, before it creates anything (the coordinator checks again
  // under the lock).
  DCP_RETURN_IF_ERROR(RefuseOtherFormats(*fs_, path_,
                                         CheckpointFormat::kHuggingFace,
                                         /*list=*/false));
  // Everything below (the shards a distributed save writes, the cleanup of
  // interrupted saves, the files a save replaces, a journal rolled forward)
  // reaches into sharded/.
  DCP_RETURN_IF_ERROR(RefuseSymbolicLink(
      *fs_, JoinPath(path_, kHfShardedDirName),
      absl::StrCat("the shards' directory of ", where, "'s save")));
  DCP_RETURN_IF_ERROR(Annotate(
      fs_->CreateDir(ShardDir(path_, options_)),
      absl::StrCat(where, ": cannot create checkpoint directory ", path_)));
  // Probe that the directory takes new files now, not after planning.
  // Abort removes the probe if its removal fails.
  DCP_RETURN_IF_ERROR(ProbeWritable(
      *fs_, path_, rank, save_id_,
      [&](const std::string& probe) { commit_->RecordCreated(probe); }));
  if (!is_coordinator_) return absl::OkStatus();
  // Holding the lock: a decided commit an interrupted save left is
  // completed first, then its temporary files are orphans.
  DCP_RETURN_IF_ERROR(LockAndRecover("checkpoint directory"));
  DCP_RETURN_IF_ERROR(
      RefuseOtherFormats(*fs_, path_, CheckpointFormat::kHuggingFace));
  RemoveTemporaryFiles(*fs_, path_);
  absl::StatusOr<std::set<std::string>> replaced =
      ReplaceableFiles(*fs_, path_);
  if (!replaced.ok()) {
    return Annotate(replaced.status(),
                    absl::StrCat(where, ": cannot list checkpoint directory ",
                                 path_, " (the files this save replaces)"));
  }
  replaced_ = *std::move(replaced);
  return absl::OkStatus();
}

absl::StatusOr<SavePlan> HuggingFaceStorageWriter::PrepareLocalPlan(
    SavePlan plan) {
  DCP_RETURN_IF_ERROR(internal_io::CheckUtf8Names(plan, kHfNamesHeldBy));
  std::set<std::string> seen;
  for (const WriteItem& item : plan.items) {
    const std::string& fqn = item.index.fqn;
    if (!item.tensor_data.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", fqn,
          "\" is not a tensor; a Hugging Face checkpoint (safetensors) "
          "holds tensors only: drop it from the state dict or save it with "
          "a FileSystemWriter"));
    }
    const TensorWriteData& data = *item.tensor_data;
    if (!InSafetensors(data.properties.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", fqn, "\" has dtype ", DTypeName(data.properties.dtype),
          ", which safetensors lacks"));
    }
    const bool whole =
        data.chunk.sizes == data.size &&
        std::all_of(data.chunk.offsets.begin(), data.chunk.offsets.end(),
                    [](int64_t o) { return o == 0; });
    if (!options_.save_distributed && !whole) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", fqn, "\" is saved as the chunk at ",
          ShapeToString(data.chunk.offsets), " of shape ",
          ShapeToString(data.chunk.sizes), " of a ", ShapeToString(data.size),
          " tensor; without save_distributed a Hugging Face checkpoint holds "
          "whole tensors (gather them first, or pass save_distributed)"));
    }
    if (options_.save_distributed && !seen.insert(fqn).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank_, " holds more than one chunk of tensor \"", fqn,
          "\"; with save_distributed each rank stores one chunk per tensor"));
    }
    if (!options_.fqn_to_index_mapping.empty()) {
      auto it = options_.fqn_to_index_mapping.find(fqn);
      if (it == options_.fqn_to_index_mapping.end() || it->second < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("fqn_to_index_mapping ",
                         it == options_.fqn_to_index_mapping.end()
                             ? "has no file for tensor \""
                             : "maps to a file index below 1 tensor \"",
                         fqn, "\""));
      }
    }
  }
  return plan;
}

absl::StatusOr<std::vector<SavePlan>>
HuggingFaceStorageWriter::PrepareGlobalPlan(std::vector<SavePlan> plans) {
  const auto& mapping = options_.fqn_to_index_mapping;
  const int highest = HighestIndex(mapping);
  DCP_ASSIGN_OR_RETURN(
      std::vector<PlannedItems> items,
      PlannedItemsOf(plans, "HuggingFaceStorageWriter", kHfNamesHeldBy));
  weight_map_.clear();
  total_size_ = 0;
  std::vector<RankFiles> ranks(plans.size());
  for (RankFiles& r : ranks) r.save_id = save_id_;
  auto file_number = [](RankFiles& r, const std::string& name) {
    auto it = std::find(r.files.begin(), r.files.end(), name);
    if (it != r.files.end()) return static_cast<int>(it - r.files.begin());
    r.files.push_back(name);
    return static_cast<int>(r.files.size() - 1);
  };
  if (options_.save_distributed) {
    for (size_t r = 0; r < plans.size(); ++r) {
      for (const auto& [fqn, bytes] : items[r]) {
        const std::string name =
            absl::StrCat(ShardPrefix(options_),
                         HfFileName(MappedIndex(mapping, fqn), highest,
                                    static_cast<int>(r) + 1));
        ranks[r].file_of[fqn] = file_number(ranks[r], name);
      }
    }
  } else {
    // Each file has one writer: a file index whose tensors lie on several
    // ranks becomes one file per rank, and the files are renumbered.
    std::map<int, std::set<size_t>> ranks_of;
    for (size_t r = 0; r < plans.size(); ++r) {
      for (const auto& [fqn, bytes] : items[r]) {
        ranks_of[MappedIndex(mapping, fqn)].insert(r);
      }
    }
    const bool split =
        std::any_of(ranks_of.begin(), ranks_of.end(),
                    [](const auto& entry) { return entry.second.size() > 1; });
    std::map<std::pair<int, size_t>, std::string> names;
    int count = 0;
    for (const auto& [index, holders] : ranks_of) count += holders.size();
    int k = 0;
    for (const auto& [index, holders] : ranks_of) {
      for (size_t r : holders) {
        names[{index, r}] =
            split ? HfFileName(++k, count) : HfFileName(index, highest);
      }
    }
    for (size_t r = 0; r < plans.size(); ++r) {
      for (const auto& [fqn, bytes] : items[r]) {
        const std::string& name = names[{MappedIndex(mapping, fqn), r}];
        ranks[r].file_of[fqn] = file_number(ranks[r], name);
        weight_map_[fqn] = name;
        total_size_ += bytes;
      }
    }
  }
  for (size_t r = 0; r < plans.size(); ++r) {
    plans[r].storage_data = EncodeRankFiles(ranks[r]);
  }
  return plans;
}

absl::Status HuggingFaceStorageWriter::WriteFile(
    const FileAssignment& assignment,
    const std::vector<const WriteItem*>& items, SavePlanner& planner,
    std::vector<WriteResult*>& results) {
  const std::string where = absl::StrCat("rank ", rank_);
  // Resolve every item, then lay the file out as the reference does.
  std::vector<Tensor> tensors(items.size());
  std::vector<SafetensorsTensor> layout(items.size());
  std::map<std::string, size_t> item_of;
  bool on_device = false;
  Json sharding = Json::object();
  for (size_t i = 0; i < items.size(); ++i) {
    const WriteItem& item = *items[i];
    absl::StatusOr<dcp::WriteValue> resolved = planner.ResolveData(item);
    if (!resolved.ok()) {
      return Annotate(resolved.status(), absl::StrCat(where, ": resolving ",
                                                      item.index.ToString()));
    }
    const Tensor* tensor = std::get_if<Tensor>(&*resolved);
    if (tensor == nullptr || !tensor->view().is_contiguous() ||
        static_cast<int64_t>(tensor->nbytes()) != item.StorageBytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", item.index.ToString(),
                       " did not resolve to a contiguous tensor of ",
                       item.StorageBytes(), " bytes"));
    }
    tensors[i] = *tensor;
    on_device = on_device || !tensor->device().is_cpu();
    layout[i] = {item.index.fqn, tensor->dtype(),
                 item.tensor_data->chunk.sizes};
    item_of[item.index.fqn] = i;
    if (assignment.sharded) {
      sharding[item.index.fqn] = {
          {kHfSavedOffsetsKey, item.tensor_data->chunk.offsets}};
    }
  }
  SortForSafetensors(layout, kDataAlignment);
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (assignment.sharded) {
    metadata[kHfShardingInfoKey] = sharding.dump();
    metadata["DCP_VERSION"] = "1.0";
  }
  absl::StatusOr<std::string> header =
      EncodeSafetensorsHeader(layout, metadata, kDataAlignment);
  if (!header.ok()) return Annotate(header.status(), where);
  const int64_t data_start = static_cast<int64_t>(header->size());
  const int64_t file_size =
      data_start + (layout.empty() ? 0 : layout.back().end);

  const std::string path = TempPath(assignment.relative);
  absl::StatusOr<std::unique_ptr<File>> opened = CreateTempFile(path);
  if (!opened.ok()) return Annotate(opened.status(), where);
  std::unique_ptr<File> file = *std::move(opened);
  if (file->direct()) {
    // ext4 runs O_DIRECT writes that allocate one at a time (as
    // FileSystemWriter::WriteFile).
    DCP_RETURN_IF_ERROR(Annotate(file->Preallocate(file_size), where));
  }
  absl::Status status;
  {
    internal_io::SequentialWriter writer(*engine_, *file, WriterOptions(*file));
    status = writer.Append(reinterpret_cast<const std::byte*>(header->data()),
                           data_start);
    if (!on_device) {
      for (size_t k = 0; k < layout.size() && status.ok(); ++k) {
        const Tensor& t = tensors[item_of[layout[k].name]];
        status = writer.Append(static_cast<const std::byte*>(t.data()),
                               static_cast<int64_t>(t.nbytes()));
      }
    } else if (status.ok()) {
      // Every tensor of the file goes through the staging pool in file
      // order (host ones are copied too); each piece is written from its
      // pinned chunk, which returns to the pool once written.
      std::vector<PipelineItem> staged;
      for (size_t k = 0; k < layout.size(); ++k) {
        staged.push_back(
            {tensors[item_of[layout[k].name]].view(), k, layout[k].name});
      }
      status = StageAndAppend(
          staged, writer,
          [](size_t, const std::byte*, int64_t) { return absl::OkStatus(); });
    }
    absl::Status finished = writer.Finish();
    status.Update(finished);
  }
  if (status.ok() && options_.sync_files) status = file->Sync();
  absl::Status closed = file->Close();
  status.Update(closed);
  if (!status.ok()) {
    return Annotate(status, absl::StrCat(where, ": writing ", path));
  }
  for (const SafetensorsTensor& t : layout) {
    const size_t i = item_of[t.name];
    WriteResult& result = *results[i];
    result.index = items[i]->index;
    result.size_in_bytes = t.end - t.begin;
    // A plain name (what dcp metadata holds): Finish knows whether the
    // files are in sharded/ (ShardPrefix).
    result.storage_data.relative_path =
        assignment.relative.substr(assignment.relative.rfind('/') + 1);
    result.storage_data.offset = data_start + t.begin;
    result.storage_data.length = t.end - t.begin;
  }
  return absl::OkStatus();
}

Future<std::vector<WriteResult>> HuggingFaceStorageWriter::WriteData(
    const SavePlan& plan, SavePlanner& planner) {
  using Result = Future<std::vector<WriteResult>>;
  absl::StatusOr<std::string> storage_data = StorageDataOf(plan);
  if (!storage_data.ok()) return Result::Ready(storage_data.status());
  absl::StatusOr<RankFiles> rank_files = DecodeRankFiles(*storage_data);
  if (!rank_files.ok()) return Result::Ready(rank_files.status());
  // Temporary names carry the coordinator's save id: its Finish renames
  // every rank's files.
  save_id_ = rank_files->save_id;
  struct Work {
    FileAssignment assignment;
    std::vector<const WriteItem*> items;
    std::vector<WriteResult*> results;
  };
  std::vector<Work> work(rank_files->files.size());
  for (size_t f = 0; f < work.size(); ++f) {
    const std::string& name = rank_files->files[f];
    if (!CheckRelativePath(name).ok()) {
      return Result::Ready(absl::InternalError(
          absl::StrCat("save plan names the file \"", name, "\"")));
    }
    work[f].assignment.relative = name;
    work[f].assignment.sharded = options_.save_distributed;
  }
  std::vector<WriteResult> results(plan.items.size());
  for (size_t i = 0; i < plan.items.size(); ++i) {
    auto it = rank_files->file_of.find(plan.items[i].index.fqn);
    if (it == rank_files->file_of.end() || it->second < 0 ||
        it->second >= static_cast<int>(work.size())) {
      return Result::Ready(absl::InternalError(absl::StrCat(
          "the save plan gives ", plan.items[i].index.ToString(), " no file")));
    }
    work[it->second].items.push_back(&plan.items[i]);
    work[it->second].results.push_back(&results[i]);
  }
  absl::Status status = WriteFiles(
      work.size(),
      std::max(options_.thread_count, options_.thread_count_consolidation),
      [&](size_t f) {
        return WriteFile(work[f].assignment, work[f].items, planner,
                         work[f].results);
      },
      ShardDir(path_, options_));
  if (!status.ok()) return Result::Ready(status);
  return Result::Ready(std::move(results));
}

absl::Status HuggingFaceStorageWriter::Finish(
    const Metadata& /*metadata*/,
    const std::vector<std::vector<WriteResult>>& results) {
  std::set<std::string> written;
  for (const std::vector<WriteResult>& rank : results) {
    for (const WriteResult& result : rank) {
      written.insert(absl::StrCat(ShardPrefix(options_),
                                  result.storage_data.relative_path));
    }
  }
  internal_io::CommitJournal journal;
  for (const std::string& relative : written) {
    journal.renames.emplace_back(TempRelativePath(relative, save_id_),
                                 relative);
  }
  std::set<std::string> committed = written;
  std::map<std::string, std::string> weight_map = weight_map_;
  if (!options_.save_distributed) {
    // The index must name exactly the tensors written (a cached plan that
    // is not the one this writer last saw would make them differ).
    size_t results_count = 0;
    for (const std::vector<WriteResult>& rank : results) {
      for (const WriteResult& result : rank) {
        ++results_count;
        auto it = weight_map.find(result.index.fqn);
        if (it == weight_map.end() ||
            it->second != result.storage_data.relative_path) {
          return absl::InternalError(absl::StrCat(
              "tensor \"", result.index.fqn,
              "\" was written to a file the planned index does not give it"));
        }
      }
    }
    if (results_count != weight_map.size()) {
      return absl::InternalError(absl::StrCat("the planned index names ",
                                              weight_map.size(), " tensors, ",
                                              results_count, " were written"));
    }
  }
  int64_t total_size = total_size_;
  const bool index =
      !options_.save_distributed || options_.enable_consolidation;
  if (options_.save_distributed && options_.enable_consolidation) {
    std::vector<std::string> outputs;
    DCP_RETURN_IF_ERROR(
        Consolidate(std::vector<std::string>(written.begin(), written.end()),
                    outputs, weight_map, total_size));
    for (const std::string& relative : outputs) {
      journal.renames.emplace_back(TempRelativePath(relative, save_id_),
                                   relative);
      committed.insert(relative);
    }
  }
  if (index) {
    Json json = {{"metadata", {{"total_size", total_size}}},
                 {"weight_map", weight_map}};
    const std::string temp = TempPath(kHfIndexFileName);
    commit_->RecordCreated(temp);
    DCP_RETURN_IF_ERROR(
        WriteSmallFile(*fs_, temp, json.dump(2) + "\n", options_.sync_files));
    journal.renames.emplace_back(TempRelativePath(kHfIndexFileName, save_id_),
                                 kHfIndexFileName);
    committed.insert(kHfIndexFileName);
  }
  for (const std::string& relative : replaced_) {
    if (!committed.contains(relative)) journal.removals.push_back(relative);
  }
  // The decision: once the journal is durable under its name, the save
  // completes whatever happens next.
  return CommitSave(kHfCommitJournalName,
                    JoinPath(path_, absl::StrCat(".", kHfCommitJournalName + 1,
                                                 ".tmp-", save_id_)),
                    journal);
}

}  // namespace dcp
