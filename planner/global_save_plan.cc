#include "planner/global_save_plan.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/status.h"
#include "planner/chunk_geometry.h"

namespace dcp {
namespace {

struct NameInfo {
  absl::string_view name;
  const WriteItem* first = nullptr;  // Defines kind, dtype and shape.
  uint32_t first_rank = 0;
  // Its groups: how many, and (after the scan) where they start in the
  // array of groups by name.
  uint32_t num_groups = 0;
  uint32_t groups_begin = 0;
  // The flatten path: a derived mask, or an explicit path (kExplicitPath).
  bool has_path = false;
  uint64_t mask = 0;
  uint64_t joined = 0;  // DerivedPath::joined, with a derived mask.
  const ObjectPath* path = nullptr;
  uint32_t path_rank = 0;
};

// ["a", 0, "b.c"]: keys quoted, list indices bare.
std::string PathRepr(const ObjectPath& path) {
  std::string out = "[";
  for (size_t i = 0; i < path.size(); ++i) {
    if (i > 0) out += ", ";
    if (const auto* key = std::get_if<std::string>(&path[i])) {
      absl::StrAppend(&out, "\"", *key, "\"");
    } else {
      absl::StrAppend(&out, std::get<int64_t>(path[i]));
    }
  }
  return out + "]";
}

std::string PathText(absl::string_view name, uint64_t mask, uint64_t joined,
                     const ObjectPath* path) {
  if (mask != kExplicitPath) {
    absl::StatusOr<ObjectPath> derived = PathFromListMask(name, mask, joined);
    return derived.ok() ? PathRepr(*derived) : "(bad mask)";
  }
  return path != nullptr ? PathRepr(*path) : "(none)";
}

// Records rank `rank`'s path for `info` (masks, or explicit `path`),
// checking it against what an earlier rank said.
absl::Status NotePath(NameInfo& info, uint32_t rank, uint64_t mask,
                      uint64_t joined, const ObjectPath* path) {
  if (mask == kExplicitPath && path == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", info.name, "\": rank ", rank, " sends no flatten path for it"));
  }
  if (!info.has_path) {
    info.has_path = true;
    info.mask = mask;
    info.joined = joined;
    info.path = path;
    info.path_rank = rank;
    return absl::OkStatus();
  }
  if (mask != kExplicitPath && info.mask != kExplicitPath) {
    if (mask == info.mask && joined == info.joined) return absl::OkStatus();
  } else {
    // At least one explicit path: compare the paths themselves.
    auto materialize = [&](uint64_t m, uint64_t j, const ObjectPath* p) {
      if (m == kExplicitPath) return absl::StatusOr<ObjectPath>(*p);
      return PathFromListMask(info.name, m, j);
    };
    absl::StatusOr<ObjectPath> a =
        materialize(info.mask, info.joined, info.path);
    absl::StatusOr<ObjectPath> b = materialize(mask, joined, path);
    if (a.ok() && b.ok() && *a == *b) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", info.name, "\": rank ", info.path_rank, " flattens it from path ",
      PathText(info.name, info.mask, info.joined, info.path), " but rank ",
      rank, " from a different path ",
      PathText(info.name, mask, joined, path)));
}

// The chunks of all groups in one flat array: for each, a header (the
// number of offsets, and of sizes << 32), then the offsets and the sizes.
// Read back in name order it is one compact array, where the items it came
// from are spread over all ranks' plans.
class ChunkCoords {
 public:
  static constexpr size_t kNone = ~size_t{0};

  explicit ChunkCoords(size_t capacity) { values_.reserve(capacity); }

  // Appends `chunk`; returns its position.
  size_t Add(const ChunkStorageMetadata& chunk) {
    const size_t at = values_.size();
    const size_t n = chunk.offsets.size();
    const size_t m = chunk.sizes.size();
    values_.resize(at + 1 + n + m);
    int64_t* out = &values_[at];
    out[0] = static_cast<int64_t>(n | (m << 32));
    std::copy(chunk.offsets.begin(), chunk.offsets.end(), out + 1);
    std::copy(chunk.sizes.begin(), chunk.sizes.end(), out + 1 + n);
    return at;
  }
  absl::Span<const int64_t> Offsets(size_t at) const {
    return absl::MakeConstSpan(&values_[at + 1], NumOffsets(at));
  }
  absl::Span<const int64_t> Sizes(size_t at) const {
    return absl::MakeConstSpan(&values_[at + 1 + NumOffsets(at)],
                               static_cast<uint64_t>(values_[at]) >> 32);
  }
  ChunkStorageMetadata Get(size_t at) const {
    const absl::Span<const int64_t> offsets = Offsets(at);
    const absl::Span<const int64_t> sizes = Sizes(at);
    return {Shape(offsets.begin(), offsets.end()),
            Shape(sizes.begin(), sizes.end())};
  }

 private:
  size_t NumOffsets(size_t at) const {
    return static_cast<uint64_t>(values_[at]) & 0xffffffffu;
  }

  std::vector<int64_t> values_;
};

bool Equal(absl::Span<const int64_t> a, const Shape& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// The items of all ranks that share one MetadataIndex.
struct Group {
  uint32_t name = 0;
  uint32_t first_rank = 0;  // Lowest rank holding it.
  size_t hash = 0;          // Of (name, offset), for GroupTable.
  // Its chunk in ChunkCoords (the offsets are the index offset), or kNone
  // for a value.
  size_t chunk = ChunkCoords::kNone;
  int64_t bytes = 0;
  int32_t hint = -1;  // Position of the chunk in the metadata.
  uint32_t holders = 0;
  uint32_t holders_begin = 0;  // Into the holder ranks array.
  uint32_t writer = 0;
};

// Whether `chunk` is all of a tensor of shape `size` (a valid shape).
bool IsWholeTensor(const ChunkStorageMetadata& chunk, const Shape& size) {
  return chunk.sizes == size && chunk.offsets.size() == size.size() &&
         std::all_of(chunk.offsets.begin(), chunk.offsets.end(),
                     [](int64_t o) { return o == 0; }) &&
         std::all_of(size.begin(), size.end(),
                     [](int64_t d) { return d >= 0; });
}

// Whether `g` (of a name with the same kind as `offset`'s item: all values
// or all tensors) is the chunk at `offset`: values have no offset and one
// group per name.
bool HasOffset(const Group& g, const ChunkCoords& coords,
               const std::optional<Shape>& offset) {
  if (!offset.has_value()) return g.chunk == ChunkCoords::kNone;
  return g.chunk != ChunkCoords::kNone &&
         Equal(coords.Offsets(g.chunk), *offset);
}

// A MetadataIndex to look up: interned name and chunk offset.
struct GroupKey {
  uint32_t name;
  const std::optional<Shape>* offset;
  size_t hash;

  GroupKey(uint32_t name_in, const std::optional<Shape>& offset_in)
      : name(name_in),
        offset(&offset_in),
        hash(offset_in.has_value() ? absl::HashOf(name_in, true, *offset_in)
                                   : absl::HashOf(name_in, false)) {}
};

// The groups seen so far, by key. The table holds 4-byte group ids and
// compares keys with the groups' chunks, so at a million items it is a
// fraction of a map from keys to ids and stays mostly in cache.
class GroupTable {
 public:
  GroupTable(const std::vector<Group>* groups, const ChunkCoords* coords,
             size_t capacity)
      : ids_(0, Hash{groups}, Eq{groups, coords}) {
    ids_.reserve(capacity);
  }

  // The id of the group with `key`, and whether it is new: when there is
  // none, `add()` appends one (with key.hash, key.name and a chunk whose
  // offsets are *key.offset) and returns its id.
  template <typename Add>
  std::pair<uint32_t, bool> FindOrAdd(const GroupKey& key, Add add) {
    bool added = false;
    auto it = ids_.lazy_emplace(key, [&](const auto& construct) {
      added = true;
      construct(add());
    });
    return {*it, added};
  }

 private:
  struct Hash {
    using is_transparent = void;
    const std::vector<Group>* groups;
    size_t operator()(uint32_t id) const { return (*groups)[id].hash; }
    size_t operator()(const GroupKey& key) const { return key.hash; }
  };
  // A name's items are all tensors or all values (checked before lookup).
  struct Eq {
    using is_transparent = void;
    const std::vector<Group>* groups;
    const ChunkCoords* coords;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(uint32_t id, const GroupKey& key) const {
      const Group& g = (*groups)[id];
      return g.hash == key.hash && g.name == key.name &&
             HasOffset(g, *coords, *key.offset);
    }
    bool operator()(const GroupKey& key, uint32_t id) const {
      return (*this)(id, key);
    }
  };
  absl::flat_hash_set<uint32_t, Hash, Eq> ids_;
};

absl::Status Disagree(absl::string_view name, absl::string_view what,
                      uint32_t rank_a, absl::string_view value_a,
                      uint32_t rank_b, absl::string_view value_b) {
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", name, "\": rank ", rank_a, " saves it with ", what, " ", value_a,
      " but rank ", rank_b, " with ", what, " ", value_b,
      "; every rank must save a name with the same ", what));
}

absl::string_view KindName(const WriteItem& item) {
  return item.type == WriteItemType::kBytesIO ? "a non-tensor value"
                                              : "a tensor";
}

// Checks `item` (from `rank`) against the first item seen for its name.
absl::Status CheckAgainstName(const NameInfo& info, const WriteItem& item,
                              uint32_t rank) {
  const WriteItem& first = *info.first;
  const bool first_bytes = first.type == WriteItemType::kBytesIO;
  const bool item_bytes = item.type == WriteItemType::kBytesIO;
  if (first_bytes != item_bytes) {
    return Disagree(info.name, "kind", info.first_rank, KindName(first), rank,
                    KindName(item));
  }
  if (item_bytes) return absl::OkStatus();
  const TensorWriteData& a = *first.tensor_data;
  const TensorWriteData& b = *item.tensor_data;
  if (a.properties.dtype != b.properties.dtype) {
    return Disagree(info.name, "dtype", info.first_rank,
                    DTypeName(a.properties.dtype), rank,
                    DTypeName(b.properties.dtype));
  }
  if (a.size != b.size) {
    return Disagree(info.name, "global shape", info.first_rank,
                    ShapeToString(a.size), rank, ShapeToString(b.size));
  }
  return absl::OkStatus();
}

absl::Status CheckItem(const WriteItem& item, uint32_t rank) {
  if (item.type == WriteItemType::kBytesIO) {
    if (!item.bytes_io_data.has_value() || item.index.offset.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " plans value \"", item.index.fqn,
                       "\" without bytes_io_data or with a chunk offset"));
    }
    return absl::OkStatus();
  }
  if (!item.tensor_data.has_value() || !item.index.offset.has_value() ||
      *item.index.offset != item.tensor_data->chunk.offsets) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " plans tensor chunk ", item.index.ToString(),
        " without tensor_data or with an index offset that "
        "differs from its chunk offsets"));
  }
  return absl::OkStatus();
}

// The flatten mapping of the metadata: every name's path, plus the explicit
// entries of names no rank planned items for.
absl::StatusOr<std::map<std::string, ObjectPath>> BuildMapping(
    std::vector<NameInfo>& names, const std::vector<uint32_t>& name_order,
    const absl::flat_hash_map<absl::string_view, uint32_t>& name_ids,
    const std::vector<SavePlannerData>& data) {
  std::map<std::string, ObjectPath> merged;
  absl::flat_hash_map<absl::string_view, std::pair<const ObjectPath*, size_t>>
      itemless;
  for (size_t r = 0; r < data.size(); ++r) {
    for (const auto& [name, path] : data[r].mapping) {
      auto id = name_ids.find(name);
      if (id != name_ids.end()) {
        // With masks, a planned name's path came from them; without, here.
        if (data[r].list_masks.empty()) {
          DCP_RETURN_IF_ERROR(
              NotePath(names[id->second], r, kExplicitPath, 0, &path));
        }
        continue;
      }
      auto [it, inserted] = itemless.try_emplace(name, &path, r);
      if (!inserted && *it->second.first != path) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"", name, "\": rank ", it->second.second,
            " flattens it from path ", PathRepr(*it->second.first),
            " but rank ", r, " from a different path ", PathRepr(path)));
      }
    }
  }
  for (uint32_t n : name_order) {
    const NameInfo& info = names[n];
    if (!info.has_path) continue;
    ObjectPath path;
    if (info.mask == kExplicitPath) {
      path = *info.path;
    } else {
      DCP_ASSIGN_OR_RETURN(path,
                           PathFromListMask(info.name, info.mask, info.joined));
    }
    merged.emplace_hint(merged.end(), std::string(info.name), std::move(path));
  }
  for (const auto& [name, entry] : itemless) {
    merged.emplace(std::string(name), *entry.first);
  }
  return merged;
}

void AssignWriters(std::vector<Group>& groups,
                   const std::vector<uint32_t>& holder_ranks, size_t num_ranks,
                   DedupPolicy policy) {
  if (policy == DedupPolicy::kLowestRank) {
    for (Group& g : groups) g.writer = g.first_rank;
    return;
  }
  std::vector<int64_t> load(num_ranks, 0);
  std::vector<uint32_t> shared;
  for (uint32_t i = 0; i < groups.size(); ++i) {
    Group& g = groups[i];
    g.writer = g.first_rank;
    if (g.holders == 1) {
      load[g.first_rank] += g.bytes;
    } else {
      shared.push_back(i);
    }
  }
  std::sort(shared.begin(), shared.end(), [&](uint32_t a, uint32_t b) {
    return groups[a].bytes != groups[b].bytes
               ? groups[a].bytes > groups[b].bytes
               : a < b;
  });
  for (uint32_t i : shared) {
    Group& g = groups[i];
    uint32_t best = g.first_rank;
    for (uint32_t k = 0; k < g.holders; ++k) {
      const uint32_t r = holder_ranks[g.holders_begin + k];
      if (load[r] < load[best]) best = r;
    }
    g.writer = best;
    load[best] += g.bytes;
  }
}

}  // namespace

absl::StatusOr<GlobalSavePlan> BuildGlobalSavePlan(
    std::vector<SavePlan> local_plans, const std::vector<SavePlannerData>& data,
    DedupPolicy policy, bool require_full_coverage) {
  const size_t num_ranks = local_plans.size();
  size_t total_items = 0;
  for (const SavePlan& plan : local_plans) total_items += plan.items.size();

  absl::flat_hash_map<absl::string_view, uint32_t> name_ids;
  // At most one name and one group per item: reserved so that they never
  // move (only the pages used are touched).
  std::vector<NameInfo> names;
  names.reserve(total_items);
  std::vector<Group> groups;
  groups.reserve(total_items);
  ChunkCoords coords(total_items * 5);  // Room for a 2-d chunk per item.
  GroupTable group_ids(&groups, &coords, total_items);
  std::vector<uint32_t> group_of_item;  // By rank, then item.
  group_of_item.reserve(total_items);
  size_t rank_begin = 0;  // Of the rank being scanned, in group_of_item.

  for (uint32_t r = 0; r < num_ranks; ++r) {
    const SavePlannerData* rank_data = r < data.size() ? &data[r] : nullptr;
    const std::vector<uint64_t>* masks =
        rank_data != nullptr && !rank_data->list_masks.empty()
            ? &rank_data->list_masks
            : nullptr;
    const std::vector<uint64_t>* joined_masks =
        masks != nullptr && !rank_data->joined_masks.empty()
            ? &rank_data->joined_masks
            : nullptr;
    if (joined_masks != nullptr && joined_masks->size() != masks->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " sends ", joined_masks->size(),
                       " joined masks for ", masks->size(), " list masks"));
    }
    size_t run = 0;  // Runs of equal names, for `masks`.
    const std::string* previous = nullptr;
    // Ranks mostly plan the same names in the same order, and replicas the
    // same chunks: the previous rank's item at the same position is tried
    // (and checked exactly) before the hash tables.
    const size_t previous_rank_begin = rank_begin;
    const size_t previous_rank_items = group_of_item.size() - rank_begin;
    rank_begin = group_of_item.size();
    const std::vector<WriteItem>& items = local_plans[r].items;
    for (size_t i = 0; i < items.size(); ++i) {
      const WriteItem& item = items[i];
      absl::Status status = CheckItem(item, r);
      if (!status.ok()) return status;
      const Group* predicted =
          i < previous_rank_items
              ? &groups[group_of_item[previous_rank_begin + i]]
              : nullptr;
      uint32_t name;
      if (predicted != nullptr &&
          names[predicted->name].name == item.index.fqn) {
        name = predicted->name;
      } else {
        auto [name_it, new_name] =
            name_ids.try_emplace(item.index.fqn, names.size());
        name = name_it->second;
        if (new_name) {
          NameInfo info;
          info.name = item.index.fqn;
          info.first = &item;
          info.first_rank = r;
          names.push_back(std::move(info));
        }
      }
      if (names[name].first != &item) {
        status = CheckAgainstName(names[name], item, r);
        if (!status.ok()) return status;
      }
      if (masks != nullptr &&
          (previous == nullptr || *previous != item.index.fqn)) {
        if (run >= masks->size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("rank ", r, " sends ", masks->size(),
                           " flatten paths for more item names"));
        }
        const uint64_t joined =
            joined_masks != nullptr ? (*joined_masks)[run] : 0;
        const uint64_t mask = (*masks)[run++];
        const ObjectPath* path = nullptr;
        if (mask == kExplicitPath) {
          auto it = rank_data->mapping.find(item.index.fqn);
          if (it != rank_data->mapping.end()) path = &it->second;
        }
        DCP_RETURN_IF_ERROR(NotePath(names[name], r, mask, joined, path));
      }
      previous = &item.index.fqn;
      uint32_t group;
      bool new_group = false;
      if (predicted != nullptr && predicted->name == name &&
          HasOffset(*predicted, coords, item.index.offset)) {
        group = static_cast<uint32_t>(predicted - groups.data());
      } else {
        const GroupKey key(name, item.index.offset);
        std::tie(group, new_group) = group_ids.FindOrAdd(key, [&] {
          Group g;
          g.name = name;
          g.first_rank = r;
          g.hash = key.hash;
          if (item.tensor_data.has_value()) {
            g.chunk = coords.Add(item.tensor_data->chunk);
          }
          g.bytes = item.StorageBytes();
          groups.push_back(g);
          ++names[name].num_groups;
          return static_cast<uint32_t>(groups.size() - 1);
        });
      }
      if (!new_group) {
        const Group& g = groups[group];
        if (item.tensor_data.has_value() &&
            !Equal(coords.Sizes(g.chunk), item.tensor_data->chunk.sizes)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor \"", item.index.fqn, "\": rank ", g.first_rank,
              " saves the chunk at offsets ", ShapeToString(*item.index.offset),
              " with sizes ", ShapeToString(coords.Get(g.chunk).sizes),
              " but rank ", r, " with sizes ",
              ShapeToString(item.tensor_data->chunk.sizes),
              "; replicated chunks must be identical"));
        }
      }
      ++groups[group].holders;
      group_of_item.push_back(group);
    }
  }

  // Holder ranks of each group, ascending (counting sort over the items).
  std::vector<uint32_t> holder_ranks(total_items);
  {
    uint32_t begin = 0;
    for (Group& g : groups) {
      g.holders_begin = begin;
      begin += g.holders;
    }
    std::vector<uint32_t> fill(groups.size(), 0);
    size_t k = 0;
    for (uint32_t r = 0; r < num_ranks; ++r) {
      for (size_t i = 0; i < local_plans[r].items.size(); ++i, ++k) {
        const uint32_t g = group_of_item[k];
        holder_ranks[groups[g].holders_begin + fill[g]++] = r;
      }
    }
  }

  GlobalSavePlan out;
  Metadata& metadata = out.metadata;
  metadata.version = kFormatVersion;
  std::vector<uint32_t> name_order(names.size());
  std::iota(name_order.begin(), name_order.end(), 0);
  std::sort(name_order.begin(), name_order.end(), [&](uint32_t a, uint32_t b) {
    return names[a].name < names[b].name;
  });
  // Groups by name, in the order they were first seen (a counting sort).
  std::vector<uint32_t> name_groups(groups.size());
  {
    uint32_t begin = 0;
    for (NameInfo& info : names) {
      info.groups_begin = begin;
      begin += info.num_groups;
      info.num_groups = 0;
    }
    for (uint32_t g = 0; g < groups.size(); ++g) {
      NameInfo& info = names[groups[g].name];
      name_groups[info.groups_begin + info.num_groups++] = g;
    }
  }
  // Validation and metadata, tensor by tensor.
  std::vector<uint32_t> order;
  std::vector<uint32_t> sorted_ids;
  for (uint32_t n : name_order) {
    const NameInfo& info = names[n];
    if (info.first->type == WriteItemType::kBytesIO) {
      metadata.state_dict_metadata.emplace_hint(
          metadata.state_dict_metadata.end(), std::string(info.name),
          BytesStorageMetadata{});
      continue;
    }
    uint32_t* ids = name_groups.data() + info.groups_begin;
    const size_t num_chunks = info.num_groups;
    const TensorWriteData& tensor = *info.first->tensor_data;
    TensorStorageMetadata tensor_metadata;
    tensor_metadata.properties = tensor.properties;
    tensor_metadata.size = tensor.size;
    // Chunks are built once, in the metadata, and sorted there.
    std::vector<ChunkStorageMetadata>& chunks = tensor_metadata.chunks;
    chunks.reserve(num_chunks);
    for (size_t k = 0; k < num_chunks; ++k) {
      chunks.push_back(coords.Get(groups[ids[k]].chunk));
    }
    auto by_offset = [](const ChunkStorageMetadata& a,
                        const ChunkStorageMetadata& b) {
      return a.offsets < b.offsets;
    };
    // Ranks usually hold consecutive chunks: often sorted already.
    if (!std::is_sorted(chunks.begin(), chunks.end(), by_offset)) {
      order.resize(num_chunks);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return by_offset(chunks[a], chunks[b]);
      });
      std::vector<ChunkStorageMetadata> sorted;
      sorted.reserve(num_chunks);
      sorted_ids.resize(num_chunks);
      for (size_t k = 0; k < num_chunks; ++k) {
        sorted.push_back(std::move(chunks[order[k]]));
        sorted_ids[k] = ids[order[k]];
      }
      chunks = std::move(sorted);
      std::copy(sorted_ids.begin(), sorted_ids.end(), ids);
    }
    for (size_t k = 0; k < num_chunks; ++k) {
      groups[ids[k]].hint = static_cast<int32_t>(k);
    }
    // One chunk holding the whole tensor (a replicated or unsharded tensor)
    // tiles it: the common case needs no further check.
    const bool whole =
        num_chunks == 1 && IsWholeTensor(chunks[0], tensor_metadata.size);
    absl::Status status =
        whole ? absl::OkStatus()
              : ValidateTiling(
                    info.name, tensor_metadata.size, chunks,
                    [&](size_t k) {
                      return absl::StrCat("[", ChunkToString(chunks[k]),
                                          "] from rank ",
                                          groups[ids[k]].first_rank);
                    },
                    require_full_coverage);
    if (!status.ok()) return status;
    metadata.state_dict_metadata.emplace_hint(
        metadata.state_dict_metadata.end(), std::string(info.name),
        std::move(tensor_metadata));
  }
  // A sharded tensor no rank holds an element of reaches no item above; one
  // that other ranks hold must be the same tensor there.
  for (uint32_t r = 0; r < data.size(); ++r) {
    for (const auto& [name, size] : data[r].unheld) {
      auto it = metadata.state_dict_metadata.find(name);
      if (it == metadata.state_dict_metadata.end()) {
        if (!require_full_coverage) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", name, "\" of shape ", ShapeToString(size),
            ": no rank holds any of its elements (rank ", r,
            " holds none); every element must be saved by one chunk"));
      }
      const auto* held = std::get_if<TensorStorageMetadata>(&it->second);
      if (held == nullptr || held->size != size) {
        const NameInfo& info = names[name_ids.at(name)];
        return absl::InvalidArgumentError(absl::StrCat(
            "\"", name, "\": rank ", r, " has a sharded tensor of shape ",
            ShapeToString(size), " (holding none of its elements), rank ",
            info.first_rank, " has ",
            held == nullptr ? std::string("a non-tensor value")
                            : absl::StrCat("a tensor of shape ",
                                           ShapeToString(held->size))));
      }
    }
  }
  DCP_ASSIGN_OR_RETURN(metadata.flatten_mapping,
                       BuildMapping(names, name_order, name_ids, data));
  AssignWriters(groups, holder_ranks, num_ranks, policy);

  // Final plans: each rank keeps what it writes. Names are no longer viewed
  // past this point, so items can be moved.
  out.plans.resize(num_ranks);
  size_t k = 0;
  for (uint32_t r = 0; r < num_ranks; ++r) {
    SavePlan& local = local_plans[r];
    SavePlan& final_plan = out.plans[r];
    final_plan.storage_data = std::move(local.storage_data);
    final_plan.usable = local.usable;
    // Keep the items this rank writes, compacting in place.
    std::vector<WriteItem>& items = local.items;
    size_t kept = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const Group& g = groups[group_of_item[k++]];
      if (g.writer != r) continue;
      if (g.hint >= 0) items[i].index.index = g.hint;
      if (kept != i) items[kept] = std::move(items[i]);
      ++kept;
    }
    items.erase(items.begin() + kept, items.end());
    final_plan.items = std::move(items);
  }
  return out;
}

}  // namespace dcp
