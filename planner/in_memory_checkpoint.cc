#include "planner/in_memory_checkpoint.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dcp {

void CopyBox(const char* src, const Shape& src_sizes, const Shape& src_offsets,
             const TensorView& dest, const Shape& dest_offsets,
             const Shape& lengths) {
  const size_t elem = ElementSize(dest.dtype());
  const size_t rank = lengths.size();
  if (NumElements(lengths) == 0) return;
  const Shape src_strides = ContiguousStrides(src_sizes);
  std::vector<int64_t> i(rank, 0);
  char* out = static_cast<char*>(dest.data());
  while (true) {
    int64_t s = 0;
    int64_t d = 0;
    for (size_t k = 0; k < rank; ++k) {
      s += (src_offsets[k] + i[k]) * src_strides[k];
      d += (dest_offsets[k] + i[k]) * dest.strides()[k];
    }
    std::memcpy(out + d * elem, src + s * elem, elem);
    size_t k = rank;
    while (k > 0) {
      --k;
      if (++i[k] < lengths[k]) break;
      i[k] = 0;
      if (k == 0) return;
    }
    if (rank == 0) return;
  }
}

absl::StatusOr<InMemoryCheckpoint> SaveInMemory(
    const std::vector<const StateDict*>& state_dicts,
    const std::vector<SavePlanner*>& planners) {
  const size_t n = planners.size();
  std::vector<SavePlan> local(n);
  for (size_t r = 0; r < n; ++r) {
    StorageMeta meta;
    meta.checkpoint_id = "memory";
    DCP_RETURN_IF_ERROR(planners[r]->SetUp(*state_dicts[r], meta, r == 0));
    DCP_ASSIGN_OR_RETURN(local[r], planners[r]->CreateLocalPlan());
  }
  InMemoryCheckpoint out;
  out.local_plans = local;
  DCP_ASSIGN_OR_RETURN(auto global,
                       planners[0]->CreateGlobalPlan(std::move(local)));
  out.central_plans = global.first;
  out.metadata = std::move(global.second);
  out.written.resize(n);
  for (size_t r = 0; r < n; ++r) {
    DCP_ASSIGN_OR_RETURN(SavePlan plan,
                         planners[r]->FinishPlan(std::move(global.first[r])));
    for (const WriteItem& item : plan.items) {
      DCP_ASSIGN_OR_RETURN(WriteValue data, planners[r]->ResolveData(item));
      std::string bytes;
      if (const auto* t = std::get_if<Tensor>(&data)) {
        if (!t->view().is_contiguous() ||
            static_cast<int64_t>(t->nbytes()) != item.StorageBytes()) {
          return absl::InternalError(
              absl::StrCat("bad tensor data for ", item.index.ToString()));
        }
        bytes.assign(static_cast<const char*>(t->data()), t->nbytes());
      } else {
        bytes = std::get<std::string>(data);
      }
      if (!out.items.emplace(item.index, std::move(bytes)).second) {
        return absl::InternalError(
            absl::StrCat(item.index.ToString(), " written twice"));
      }
      out.written[r].push_back(item);
    }
  }
  return out;
}

absl::Status LoadFromMemory(const InMemoryCheckpoint& checkpoint,
                            const std::vector<StateDict*>& state_dicts,
                            const std::vector<LoadPlanner*>& planners) {
  const size_t n = planners.size();
  std::vector<LoadPlan> local(n);
  for (size_t r = 0; r < n; ++r) {
    DCP_RETURN_IF_ERROR(
        planners[r]->SetUp(state_dicts[r], checkpoint.metadata, r == 0));
    DCP_ASSIGN_OR_RETURN(local[r], planners[r]->CreateLocalPlan());
  }
  DCP_ASSIGN_OR_RETURN(std::vector<LoadPlan> global,
                       planners[0]->CreateGlobalPlan(std::move(local)));
  for (size_t r = 0; r < n; ++r) {
    DCP_ASSIGN_OR_RETURN(LoadPlan plan,
                         planners[r]->FinishPlan(std::move(global[r])));
    for (const ReadItem& item : plan.items) {
      auto it = checkpoint.items.find(item.storage_index);
      if (it == checkpoint.items.end()) {
        return absl::InternalError(
            absl::StrCat("no stored item ", item.storage_index.ToString()));
      }
      if (item.type == LoadItemType::kBytesIO) {
        DCP_RETURN_IF_ERROR(planners[r]->LoadBytes(item, it->second));
        continue;
      }
      const auto& tensor = std::get<TensorStorageMetadata>(
          checkpoint.metadata.state_dict_metadata.at(item.storage_index.fqn));
      const ChunkStorageMetadata& chunk =
          tensor.chunks.at(item.storage_index.index.value());
      if (chunk.offsets != *item.storage_index.offset) {
        return absl::InternalError("bad index hint");
      }
      DCP_ASSIGN_OR_RETURN(TensorView dest, planners[r]->ResolveTensor(item));
      CopyBox(it->second.data(), chunk.sizes, item.storage_offsets, dest,
              item.dest_offsets, item.lengths);
      DCP_RETURN_IF_ERROR(planners[r]->CommitTensor(item, dest));
    }
  }
  return absl::OkStatus();
}

}  // namespace dcp
