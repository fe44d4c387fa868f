#include "planner/plan_cache.h"

#include <xxhash.h>

#include <cstring>
#include <string>

namespace dcp {
namespace {

void AppendInt(std::string& out, int64_t v) {
  char bytes[sizeof(v)];
  std::memcpy(bytes, &v, sizeof(v));
  out.append(bytes, sizeof(v));
}

void AppendShape(std::string& out, const Shape& shape) {
  AppendInt(out, static_cast<int64_t>(shape.size()));
  for (int64_t d : shape) AppendInt(out, d);
}

}  // namespace

bool IsUnchangedSavePlan(const SavePlan& plan) {
  if (!plan.items.empty() || plan.planner_data.empty()) return false;
  absl::StatusOr<SavePlannerData> data =
      DecodeSavePlannerData(plan.planner_data);
  return data.ok() && data->unchanged;
}

PlanDigest DigestSavePlan(
    const std::vector<WriteItem>& items, const FlattenMapping& mapping,
    const std::vector<std::pair<std::string, Shape>>& unheld) {
  // Every field of every item, length-prefixed so that no two plans share
  // a byte stream.
  std::string buffer;
  buffer.reserve(items.size() * 96);
  for (const WriteItem& item : items) {
    AppendInt(buffer, static_cast<int64_t>(item.index.fqn.size()));
    buffer += item.index.fqn;
    AppendInt(buffer, item.index.offset.has_value());
    if (item.index.offset.has_value()) AppendShape(buffer, *item.index.offset);
    AppendInt(buffer, static_cast<int64_t>(item.type));
    AppendInt(buffer, item.bytes_io_data.has_value()
                          ? item.bytes_io_data->nbytes
                          : int64_t{-1});
    AppendInt(buffer, item.tensor_data.has_value());
    if (item.tensor_data.has_value()) {
      const TensorWriteData& t = *item.tensor_data;
      AppendShape(buffer, t.chunk.offsets);
      AppendShape(buffer, t.chunk.sizes);
      AppendInt(buffer, static_cast<int64_t>(t.properties.dtype));
      AppendInt(buffer, t.properties.requires_grad);
      AppendInt(buffer, t.properties.pin_memory);
      AppendShape(buffer, t.size);
    }
  }
  const std::string encoded_mapping = EncodeFlattenMapping(mapping);
  AppendInt(buffer, static_cast<int64_t>(encoded_mapping.size()));
  buffer += encoded_mapping;
  AppendInt(buffer, static_cast<int64_t>(unheld.size()));
  for (const auto& [name, size] : unheld) {
    AppendInt(buffer, static_cast<int64_t>(name.size()));
    buffer += name;
    AppendShape(buffer, size);
  }
  return DigestBytes(buffer);
}

PlanDigest DigestBytes(absl::string_view bytes) {
  const XXH128_hash_t hash = XXH3_128bits(bytes.data(), bytes.size());
  return PlanDigest{hash.high64, hash.low64};
}

SavePlanCache::SavePlanCache(size_t capacity)
    : capacity_(capacity == 0 ? 1 : capacity),
      rank_finals_(capacity_),
      globals_(capacity_) {}

std::shared_ptr<SavePlanCache> SavePlanCache::ProcessDefault() {
  static const auto* cache =
      new std::shared_ptr<SavePlanCache>(std::make_shared<SavePlanCache>());
  return *cache;
}

DigestLru<SavePlanCache::CoordinatorRankEntry>& SavePlanCache::coordinator_rank(
    size_t rank) {
  while (ranks_.size() <= rank) ranks_.emplace_back(capacity_);
  return ranks_[rank];
}

}  // namespace dcp
