#include "planner/global_load_plan.h"

#include <algorithm>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

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
// (the hint makes it O(1)), values from their storage location. Names are
// viewed, not copied: they must outlive this.
class StoredSizes {
 public:
  explicit StoredSizes(const Metadata& metadata) : metadata_(metadata) {}

  int64_t Of(const MetadataIndex& index) {
    auto [it, inserted] =
        tensors_.try_emplace(absl::string_view(index.fqn), nullptr);
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
  absl::flat_hash_map<absl::string_view, const TensorStorageMetadata*> tensors_;
};

// A stored item that some rank reads.
struct StoredItem {
  int64_t bytes = 0;
  uint32_t holders = 0;        // Ranks that need it.
  uint32_t holders_begin = 0;  // Into the holder ranks array.
  int32_t last_rank = -1;      // While scanning: the last rank counted.
  int32_t reader = -1;
};

// The stored items all ranks read, grouped across ranks, with the ranks
// needing each (ascending).
struct StoredItems {
  std::vector<StoredItem> items;
  std::vector<uint32_t> of_read;  // Per read item, by rank then position.
  std::vector<int32_t> holder_ranks;
};

StoredItems GroupStoredItems(const std::vector<LoadPlan>& plans,
                             const Metadata& metadata) {
  StoredItems out;
  size_t total = 0;
  for (const LoadPlan& plan : plans) total += plan.items.size();
  out.of_read.reserve(total);
  absl::flat_hash_map<IndexRef, uint32_t> ids;
  ids.reserve(total / 2);
  StoredSizes sizes(metadata);
  for (int32_t r = 0; r < static_cast<int32_t>(plans.size()); ++r) {
    for (const ReadItem& read : plans[r].items) {
      auto [it, inserted] =
          ids.try_emplace(IndexRef{&read.storage_index},
                          static_cast<uint32_t>(out.items.size()));
      if (inserted) {
        out.items.emplace_back();
        out.items.back().bytes = sizes.Of(read.storage_index);
      }
      StoredItem& item = out.items[it->second];
      if (item.last_rank != r) {
        item.last_rank = r;
        ++item.holders;
      }
      out.of_read.push_back(it->second);
    }
  }
  uint32_t begin = 0;
  for (StoredItem& item : out.items) {
    item.holders_begin = begin;
    begin += item.holders;
    item.holders = 0;  // Refilled below.
  }
  out.holder_ranks.resize(begin);
  size_t k = 0;
  for (int32_t r = 0; r < static_cast<int32_t>(plans.size()); ++r) {
    for (size_t i = 0; i < plans[r].items.size(); ++i) {
      StoredItem& item = out.items[out.of_read[k++]];
      const uint32_t n = item.holders;
      if (n > 0 && out.holder_ranks[item.holders_begin + n - 1] == r) continue;
      out.holder_ranks[item.holders_begin + n] = r;
      ++item.holders;
    }
  }
  return out;
}

bool ByIndex(const SharedRead& a, const SharedRead& b) {
  return a.storage_index < b.storage_index;
}

void SortByIndex(std::vector<SharedRead>& shares) {
  // Plans list tensors in name order: usually sorted already.
  if (!std::is_sorted(shares.begin(), shares.end(), ByIndex)) {
    std::sort(shares.begin(), shares.end(), ByIndex);
  }
}

}  // namespace

std::vector<LoadPlan> BuildGlobalLoadPlan(std::vector<LoadPlan> plans,
                                          const Metadata& metadata) {
  for (LoadPlan& plan : plans) {
    plan.read_for_peers.clear();
    plan.received_from.clear();
  }
  StoredItems stored = GroupStoredItems(plans, metadata);
  std::vector<StoredItem>& items = stored.items;
  auto holders = [&](const StoredItem& item) {
    return absl::MakeConstSpan(&stored.holder_ranks[item.holders_begin],
                               item.holders);
  };
  std::vector<int64_t> load(plans.size(), 0);
  std::vector<uint32_t> shared;
  for (uint32_t i = 0; i < items.size(); ++i) {
    if (items[i].holders == 1) {
      load[holders(items[i])[0]] += items[i].bytes;
    } else {
      shared.push_back(i);
    }
  }
  std::sort(shared.begin(), shared.end(), [&](uint32_t a, uint32_t b) {
    return items[a].bytes != items[b].bytes ? items[a].bytes > items[b].bytes
                                            : a < b;
  });
  for (uint32_t i : shared) {
    StoredItem& item = items[i];
    int32_t reader = holders(item)[0];
    for (int32_t r : holders(item)) {
      if (load[r] < load[reader]) reader = r;
    }
    load[reader] += item.bytes;
    item.reader = reader;
  }
  // Annotations, rank by rank in plan order, once per stored item; the
  // index is copied from the rank's own read item.
  for (StoredItem& item : items) item.last_rank = -1;
  size_t k = 0;
  for (int32_t r = 0; r < static_cast<int32_t>(plans.size()); ++r) {
    LoadPlan& plan = plans[r];
    for (const ReadItem& read : plan.items) {
      StoredItem& item = items[stored.of_read[k++]];
      if (item.holders == 1 || item.last_rank == r) continue;
      item.last_rank = r;
      if (item.reader != r) {
        plan.received_from.push_back({read.storage_index, {item.reader}});
        continue;
      }
      SharedRead out{read.storage_index, {}};
      out.ranks.reserve(item.holders - 1);
      for (int32_t peer : holders(item)) {
        if (peer != r) out.ranks.push_back(peer);
      }
      plan.read_for_peers.push_back(std::move(out));
    }
    SortByIndex(plan.read_for_peers);
    SortByIndex(plan.received_from);
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
