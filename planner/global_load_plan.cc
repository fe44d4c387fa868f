#include "planner/global_load_plan.h"

#include <algorithm>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace dcp {
namespace {

// Hashes and compares the MetadataIndex a pointer refers to.
struct IndexRef {
  const MetadataIndex* index;
  template <typename H>
  friend H AbslHashValue(H h, const IndexRef& r) {
    return H::combine(std::move(h), *r.index);
  }
  friend bool operator==(const IndexRef& a, const IndexRef& b) {
    return *a.index == *b.index;
  }
};

// Bytes of stored items, by name then chunk: tensors from their chunk sizes
// (the hint makes it O(1)), values from their storage location.
class StoredSizes {
 public:
  explicit StoredSizes(const Metadata& metadata) : metadata_(metadata) {}

  int64_t Of(const MetadataIndex& index) {
    auto [it, inserted] = tensors_.try_emplace(index.fqn, nullptr);
    if (inserted) {
      auto entry = metadata_.state_dict_metadata.find(index.fqn);
      if (entry != metadata_.state_dict_metadata.end()) {
        it->second = std::get_if<TensorStorageMetadata>(&entry->second);
      }
    }
    const TensorStorageMetadata* tensor = it->second;
    if (tensor == nullptr || !index.offset.has_value()) {
      auto stored = metadata_.storage_data.find(index);
      return stored != metadata_.storage_data.end() ? stored->second.length : 1;
    }
    const int64_t elem =
        static_cast<int64_t>(ElementSize(tensor->properties.dtype));
    const auto& chunks = tensor->chunks;
    if (index.index.has_value() && *index.index >= 0 &&
        static_cast<size_t>(*index.index) < chunks.size() &&
        chunks[*index.index].offsets == *index.offset) {
      return NumElements(chunks[*index.index].sizes) * elem;
    }
    for (const ChunkStorageMetadata& c : chunks) {
      if (c.offsets == *index.offset) return NumElements(c.sizes) * elem;
    }
    return 0;
  }

 private:
  const Metadata& metadata_;
  absl::flat_hash_map<std::string, const TensorStorageMetadata*> tensors_;
};

struct StoredItem {
  const MetadataIndex* index;
  int64_t bytes = 0;
  std::vector<int32_t> ranks;  // Ascending.
};

// The distinct stored items of each rank, grouped across ranks.
std::vector<StoredItem> GroupStoredItems(const std::vector<LoadPlan>& plans,
                                         const Metadata& metadata) {
  absl::flat_hash_map<IndexRef, uint32_t> ids;
  std::vector<StoredItem> items;
  StoredSizes sizes(metadata);
  for (int32_t r = 0; r < static_cast<int32_t>(plans.size()); ++r) {
    for (const ReadItem& read : plans[r].items) {
      auto [it, inserted] =
          ids.try_emplace(IndexRef{&read.storage_index}, items.size());
      if (inserted) {
        items.push_back(
            {&read.storage_index, sizes.Of(read.storage_index), {}});
      }
      std::vector<int32_t>& ranks = items[it->second].ranks;
      if (ranks.empty() || ranks.back() != r) ranks.push_back(r);
    }
  }
  return items;
}

bool ByIndex(const SharedRead& a, const SharedRead& b) {
  return a.storage_index < b.storage_index;
}

}  // namespace

std::vector<LoadPlan> BuildGlobalLoadPlan(std::vector<LoadPlan> plans,
                                          const Metadata& metadata) {
  for (LoadPlan& plan : plans) {
    plan.read_for_peers.clear();
    plan.received_from.clear();
  }
  std::vector<StoredItem> items = GroupStoredItems(plans, metadata);
  std::vector<int64_t> load(plans.size(), 0);
  std::vector<uint32_t> shared;
  for (uint32_t i = 0; i < items.size(); ++i) {
    if (items[i].ranks.size() == 1) {
      load[items[i].ranks[0]] += items[i].bytes;
    } else {
      shared.push_back(i);
    }
  }
  std::sort(shared.begin(), shared.end(), [&](uint32_t a, uint32_t b) {
    return items[a].bytes != items[b].bytes ? items[a].bytes > items[b].bytes
                                            : a < b;
  });
  std::vector<std::pair<uint32_t, int32_t>> assigned;  // (item, reader)
  assigned.reserve(shared.size());
  for (uint32_t i : shared) {
    const StoredItem& item = items[i];
    int32_t reader = item.ranks[0];
    for (int32_t r : item.ranks) {
      if (load[r] < load[reader]) reader = r;
    }
    load[reader] += item.bytes;
    assigned.emplace_back(i, reader);
  }
  for (const auto& [i, reader] : assigned) {
    const StoredItem& item = items[i];
    SharedRead out{*item.index, {}};
    for (int32_t r : item.ranks) {
      if (r == reader) continue;
      out.ranks.push_back(r);
      plans[r].received_from.push_back({*item.index, {reader}});
    }
    plans[reader].read_for_peers.push_back(std::move(out));
  }
  for (LoadPlan& plan : plans) {
    std::sort(plan.read_for_peers.begin(), plan.read_for_peers.end(), ByIndex);
    std::sort(plan.received_from.begin(), plan.received_from.end(), ByIndex);
  }
  return plans;
}

std::vector<int64_t> ReadBytesPerRank(const std::vector<LoadPlan>& plans,
                                      const Metadata& metadata) {
  std::vector<int64_t> bytes(plans.size(), 0);
  StoredSizes sizes(metadata);
  for (size_t r = 0; r < plans.size(); ++r) {
    absl::flat_hash_set<IndexRef> skip;
    for (const SharedRead& s : plans[r].received_from) {
      skip.insert(IndexRef{&s.storage_index});
    }
    absl::flat_hash_set<IndexRef> seen;
    for (const ReadItem& read : plans[r].items) {
      const IndexRef ref{&read.storage_index};
      if (skip.contains(ref) || !seen.insert(ref).second) continue;
      bytes[r] += sizes.Of(read.storage_index);
    }
  }
  return bytes;
}

}  // namespace dcp
