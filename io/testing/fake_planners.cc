#include "io/testing/fake_planners.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dcp::testing {

void FakeSavePlanner::AddTensor(const std::string& fqn, Tensor tensor) {
  Shape sizes = tensor.sizes();
  AddShard(fqn, sizes, Shape(sizes.size(), 0), std::move(tensor));
}

void FakeSavePlanner::AddShard(const std::string& fqn, Shape global,
                               Shape offsets, Tensor chunk) {
  TensorStorageMetadata& meta = tensors_[fqn];
  meta.properties.dtype = chunk.dtype();
  meta.size = global;
  meta.chunks.push_back({offsets, chunk.sizes()});
  WriteItem item;
  item.index =
      MetadataIndex(fqn, offsets, static_cast<int64_t>(meta.chunks.size() - 1));
  item.type = offsets == Shape(global.size(), 0) && chunk.sizes() == global
                  ? WriteItemType::kTensor
                  : WriteItemType::kShard;
  item.tensor_data =
      TensorWriteData{meta.chunks.back(), meta.properties, global};
  MetadataIndex key = item.index;
  entries_.insert_or_assign(key, Entry{std::move(item), std::move(chunk)});
}

void FakeSavePlanner::AddBytes(const std::string& fqn, std::string bytes) {
  WriteItem item;
  item.index = MetadataIndex(fqn);
  item.type = WriteItemType::kBytesIO;
  item.bytes_io_data = BytesIOWriteData{static_cast<int64_t>(bytes.size())};
  entries_.insert_or_assign(item.index, Entry{item, std::move(bytes)});
}

SavePlan FakeSavePlanner::Plan() const {
  SavePlan plan;
  for (const auto& [index, entry] : entries_) plan.items.push_back(entry.item);
  return plan;
}

Metadata FakeSavePlanner::GlobalMetadata() const {
  Metadata metadata;
  for (const auto& [index, entry] : entries_) {
    if (entry.item.type == WriteItemType::kBytesIO) {
      metadata.state_dict_metadata[index.fqn] = BytesStorageMetadata{};
    }
  }
  for (const auto& [fqn, tensor] : tensors_) {
    metadata.state_dict_metadata[fqn] = tensor;
  }
  return metadata;
}

absl::StatusOr<WriteValue> FakeSavePlanner::ResolveData(const WriteItem& item) {
  auto it = entries_.find(item.index);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat("fake planner has no item ", item.index.ToString()));
  }
  return it->second.data;
}

void FakeLoadPlanner::SetDestination(const MetadataIndex& dest_index,
                                     Tensor tensor) {
  destinations_.insert_or_assign(dest_index, std::move(tensor));
}

std::map<std::string, std::string> FakeLoadPlanner::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

absl::Status FakeLoadPlanner::LoadBytes(const ReadItem& item,
                                        absl::string_view bytes) {
  absl::MutexLock lock(&mu_);
  bytes_[item.dest_index.fqn] = std::string(bytes);
  return absl::OkStatus();
}

absl::StatusOr<TensorView> FakeLoadPlanner::ResolveTensor(
    const ReadItem& item) {
  auto it = destinations_.find(item.dest_index);
  if (it == destinations_.end()) {
    return absl::NotFoundError(absl::StrCat("fake planner has no destination ",
                                            item.dest_index.ToString()));
  }
  return it->second.view();
}

absl::Status FakeLoadPlanner::CommitTensor(const ReadItem&, const TensorView&) {
  ++commits_;
  return absl::OkStatus();
}

LoadPlan WholeItemLoadPlan(const Metadata& metadata) {
  LoadPlan plan;
  for (const auto& [index, info] : metadata.storage_data) {
    ReadItem item;
    item.dest_index = index;
    item.storage_index = index;
    auto value = metadata.state_dict_metadata.find(index.fqn);
    const auto* tensor =
        value == metadata.state_dict_metadata.end()
            ? nullptr
            : std::get_if<TensorStorageMetadata>(&value->second);
    if (tensor == nullptr) {
      item.type = LoadItemType::kBytesIO;
    } else {
      item.type = LoadItemType::kTensor;
      for (const ChunkStorageMetadata& chunk : tensor->chunks) {
        if (chunk.offsets == index.offset) item.lengths = chunk.sizes;
      }
      item.storage_offsets = Shape(item.lengths.size(), 0);
      item.dest_offsets = Shape(item.lengths.size(), 0);
    }
    plan.items.push_back(std::move(item));
  }
  return plan;
}

absl::Status SaveOneRank(StorageWriter& writer, FakeSavePlanner& planner,
                         bool abort_on_failure, std::optional<int> rank_local) {
  auto run = [&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(writer.Reset(""));
    if (rank_local.has_value()) {
      DCP_RETURN_IF_ERROR(writer.SelectRankLocal(*rank_local));
    }
    DCP_RETURN_IF_ERROR(writer.SetUp(/*is_coordinator=*/true, /*rank=*/0,
                                     /*use_collectives=*/false));
    DCP_ASSIGN_OR_RETURN(SavePlan local, planner.CreateLocalPlan());
    DCP_ASSIGN_OR_RETURN(local, writer.PrepareLocalPlan(std::move(local)));
    std::vector<SavePlan> plans;
    plans.push_back(std::move(local));
    DCP_ASSIGN_OR_RETURN(auto global,
                         planner.CreateGlobalPlan(std::move(plans)));
    DCP_ASSIGN_OR_RETURN(plans,
                         writer.PrepareGlobalPlan(std::move(global.first)));
    DCP_ASSIGN_OR_RETURN(SavePlan final_plan, planner.FinishPlan(plans[0]));
    Future<std::vector<WriteResult>> written =
        writer.WriteData(final_plan, planner);
    DCP_ASSIGN_OR_RETURN(std::vector<WriteResult> results, written.Wait());
    DCP_RETURN_IF_ERROR(writer.Finish(global.second, {results}));
    return writer.MarkCommitted();
  };
  absl::Status status = run();
  if (!status.ok() && abort_on_failure) writer.Abort();
  return status;
}

absl::Status LoadOneRank(StorageReader& reader, LoadPlanner& planner,
                         const LoadPlan* plan) {
  DCP_ASSIGN_OR_RETURN(Metadata metadata, reader.ReadMetadata());
  DCP_RETURN_IF_ERROR(reader.SetUp(metadata, /*is_coordinator=*/true));
  LoadPlan whole = WholeItemLoadPlan(metadata);
  return reader.ReadData(plan != nullptr ? *plan : whole, planner).Wait();
}

Tensor PatternTensor(DType dtype, Shape sizes, uint32_t seed) {
  Tensor tensor = Tensor::Empty(dtype, std::move(sizes));
  auto* bytes = static_cast<uint8_t*>(tensor.data());
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < tensor.nbytes(); ++i) {
    state = state * 1664525u + 1013904223u;
    bytes[i] = static_cast<uint8_t>(state >> 24);
  }
  return tensor;
}

}  // namespace dcp::testing
