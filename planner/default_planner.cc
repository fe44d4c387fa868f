#include "planner/default_planner.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/dtype_convert.h"
#include "core/status.h"
#include "planner/chunk_geometry.h"
#include "planner/global_load_plan.h"
#include "planner/global_save_plan.h"
#include "planner/value_codec.h"

namespace dcp {
namespace {

absl::Status NestingError(const std::string& key, const StateValue& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("\"", key, "\" is a ", StateKindName(value.kind()),
                   "; nested state dicts need flatten_state_dict=true"));
}

// Flattens `state_dict`, or takes its top-level values as they are when
// `flatten` is off (then containers are an error).
absl::StatusOr<FlatStateDict> Leaves(const StateDict& state_dict,
                                     bool flatten) {
  if (flatten) return FlattenStateDict(state_dict);
  FlatStateDict out;
  for (const auto& [key, value] : state_dict) {
    if (value.is_container()) return NestingError(key, value);
    out.leaves.emplace(key, value);
    out.mapping.emplace(key, ObjectPath{key});
  }
  return out;
}

// The leaves of `state_dict` as pointers into it, sorted by name, or its
// top-level values when `flatten` is off (then containers are an error).
absl::StatusOr<std::vector<std::pair<std::string, StateValue*>>> LeavesInPlace(
    StateDict& state_dict, bool flatten) {
  if (flatten) return FlattenStateDictInPlace(state_dict);
  std::vector<std::pair<std::string, StateValue*>> out;
  out.reserve(state_dict.size());
  for (auto& [key, value] : state_dict) {
    if (value.is_container()) return NestingError(key, value);
    out.emplace_back(key, &value);
  }
  return out;
}

Shape Zeros(size_t rank) { return Shape(rank, 0); }

// Whether a local shard of `st` is left out of the plan: an empty shard of
// a non-empty tensor holds no bytes, and its offset may equal a
// neighbour's (rank r holds columns [3, 3), rank r+1 holds [3, 5)):
// planning it would look like a replica that disagrees in size.
bool UnplannedShard(const ShardedTensor& st, const Shard& shard) {
  return shard.tensor.numel() == 0 && NumElements(st.global_sizes()) > 0;
}

// The offsets two local shards of one tensor share, if any.
std::optional<Shape> RepeatedOffsets(const ShardedTensor& st) {
  const std::vector<Shard>& shards = st.local_shards();
  if (shards.size() < 2) return std::nullopt;
  std::vector<const Shape*> offsets;
  offsets.reserve(shards.size());
  for (const Shard& shard : shards) {
    if (!UnplannedShard(st, shard)) offsets.push_back(&shard.offsets);
  }
  std::sort(offsets.begin(), offsets.end(),
            [](const Shape* a, const Shape* b) { return *a < *b; });
  for (size_t i = 1; i < offsets.size(); ++i) {
    if (*offsets[i] == *offsets[i - 1]) return *offsets[i];
  }
  return std::nullopt;
}

WriteItem TensorItem(const std::string& name, WriteItemType type,
                     const Shape& offsets, const Shape& sizes, DType dtype,
                     const Shape& global_size) {
  WriteItem item;
  item.index = MetadataIndex(name, offsets);
  item.type = type;
  TensorWriteData data;
  data.chunk.offsets = offsets;
  data.chunk.sizes = sizes;
  data.properties.dtype = dtype;
  data.size = global_size;
  item.tensor_data = std::move(data);
  return item;
}

}  // namespace

// ---------------------------------------------------------------------------
// DefaultSavePlanner

DefaultSavePlanner::DefaultSavePlanner(DefaultSavePlannerOptions options)
    : options_(std::move(options)) {}

absl::Status DefaultSavePlanner::SetUp(const StateDict& state_dict,
                                       const StorageMeta& storage_meta,
                                       bool is_coordinator) {
  DCP_ASSIGN_OR_RETURN(FlatStateDict flat,
                       Leaves(state_dict, options_.flatten_state_dict));
  for (const auto& [name, value] : flat.leaves) {
    if (value.is_sharded_tensor()) {
      DCP_RETURN_IF_ERROR(value.sharded_tensor().Validate(name));
    }
  }
  leaves_ = std::move(flat.leaves);
  mapping_ =
      options_.flatten_state_dict ? std::move(flat.mapping) : FlattenMapping{};
  storage_meta_ = storage_meta;
  is_coordinator_ = is_coordinator;
  planned_.clear();
  encoded_values_.clear();
  return absl::OkStatus();
}

absl::StatusOr<SavePlan> DefaultSavePlanner::BuildLocalPlan(
    SavePlannerData* data) {
  SavePlan plan;
  data->unheld.clear();
  plan.items.reserve(leaves_.size());
  planned_.clear();
  planned_.reserve(leaves_.size());
  encoded_values_.clear();
  for (const auto& [name, value] : leaves_) {
    const bool requires_grad =
        !options_.requires_grad.empty() && options_.requires_grad.count(name);
    const size_t ndim = value.is_tensor() ? value.tensor().sizes().size()
                        : value.is_sharded_tensor()
                            ? value.sharded_tensor().global_sizes().size()
                            : 0;
    if (absl::StrContains(name, '\0')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the name \"", absl::CHexEscape(name),
          "\" holds a NUL byte, which checkpoint names cannot hold"));
    }
    if (ndim > static_cast<size_t>(kMaxTensorDims)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", name, "\" has ", ndim,
          " dimensions; a checkpoint's tensors have at most ", kMaxTensorDims));
    }
    if (value.is_tensor()) {
      const Tensor& t = value.tensor();
      plan.items.push_back(TensorItem(name, WriteItemType::kTensor,
                                      Zeros(t.sizes().size()), t.sizes(),
                                      t.dtype(), t.sizes()));
      plan.items.back().tensor_data->properties.requires_grad = requires_grad;
      planned_.emplace(name, &value);
    } else if (value.is_sharded_tensor()) {
      const ShardedTensor& st = value.sharded_tensor();
      if (std::optional<Shape> repeated = RepeatedOffsets(st)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sharded tensor \"", name, "\" has two local shards at offsets ",
            ShapeToString(*repeated)));
      }
      const size_t items_before = plan.items.size();
      for (const Shard& shard : st.local_shards()) {
        if (UnplannedShard(st, shard)) continue;
        plan.items.push_back(TensorItem(name, WriteItemType::kShard,
                                        shard.offsets, shard.tensor.sizes(),
                                        st.dtype(), st.global_sizes()));
        plan.items.back().tensor_data->properties.requires_grad = requires_grad;
      }
      if (plan.items.size() == items_before &&
          NumElements(st.global_sizes()) > 0) {
        data->unheld.emplace_back(name, st.global_sizes());
      }
      planned_.emplace(name, &value);
    } else {
      DCP_ASSIGN_OR_RETURN(std::string encoded, EncodeValue(value));
      WriteItem item;
      item.index = MetadataIndex(name);
      item.type = WriteItemType::kBytesIO;
      item.bytes_io_data =
          BytesIOWriteData{static_cast<int64_t>(encoded.size())};
      encoded_values_.emplace(name, std::move(encoded));
      plan.items.push_back(std::move(item));
    }
  }
  return plan;
}

DedupPolicy DefaultSavePlanner::policy() const {
  return options_.dedup_save_to_lowest_rank ? DedupPolicy::kLowestRank
                                            : DedupPolicy::kBalanceBytes;
}

absl::StatusOr<SavePlan> DefaultSavePlanner::CreateLocalPlan() {
  SavePlannerData data;
  DCP_ASSIGN_OR_RETURN(SavePlan plan, BuildLocalPlan(&data));
  if (options_.flatten_state_dict)
    SetCompactMapping(plan.items, mapping_, &data);
  local_digest_.reset();
  if (options_.enable_plan_caching) {
    if (cache_ == nullptr) {
      cache_ = options_.plan_cache != nullptr ? options_.plan_cache
                                              : SavePlanCache::ProcessDefault();
    }
    const PlanDigest digest = DigestSavePlan(plan.items, mapping_, data.unheld);
    local_digest_ = digest;
    data.digest = digest;
    absl::MutexLock lock(&cache_->mutex());
    if (cache_->rank_finals().Find(digest) != nullptr) {
      SavePlan marker;
      SavePlannerData marker_data;
      marker_data.digest = digest;
      marker_data.unchanged = true;
      marker.planner_data = EncodeSavePlannerData(marker_data);
      return marker;
    }
  }
  plan.planner_data = EncodeSavePlannerData(data);
  return plan;
}

absl::StatusOr<std::pair<std::vector<SavePlan>, Metadata>>
DefaultSavePlanner::CreateGlobalPlan(std::vector<SavePlan> local_plans) {
  DCP_ASSIGN_OR_RETURN(GlobalResult global,
                       BuildGlobal(std::move(local_plans)));
  // Metadata the cache holds is copied; a new one is handed over.
  Metadata metadata =
      global.cached ? *global.metadata : std::move(*global.metadata);
  return std::make_pair(std::move(global.plans), std::move(metadata));
}

absl::StatusOr<SharedGlobalSavePlan> DefaultSavePlanner::CreateSharedGlobalPlan(
    std::vector<SavePlan> local_plans) {
  DCP_ASSIGN_OR_RETURN(GlobalResult global,
                       BuildGlobal(std::move(local_plans)));
  return SharedGlobalSavePlan{std::move(global.plans),
                              std::move(global.metadata)};
}

absl::StatusOr<DefaultSavePlanner::GlobalResult>
DefaultSavePlanner::BuildGlobal(std::vector<SavePlan> local_plans) {
  std::vector<SavePlannerData> data(local_plans.size());
  bool cacheable = options_.enable_plan_caching;
  for (size_t r = 0; r < local_plans.size(); ++r) {
    if (local_plans[r].planner_data.empty()) {
      cacheable = false;
      continue;
    }
    absl::StatusOr<SavePlannerData> decoded =
        DecodeSavePlannerData(local_plans[r].planner_data);
    if (!decoded.ok()) {
      return Annotate(decoded.status(), absl::StrCat("plan of rank ", r));
    }
    data[r] = std::move(*decoded);
    if (!data[r].digest.has_value()) cacheable = false;
  }
  if (cacheable) {
    return CreateCachedGlobalPlan(std::move(local_plans), std::move(data));
  }
  for (size_t r = 0; r < local_plans.size(); ++r) {
    if (data[r].unchanged) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r,
          " sent an unchanged-plan marker, but not every rank caches plans; "
          "enable plan caching on all ranks or none"));
    }
  }
  DCP_ASSIGN_OR_RETURN(
      GlobalSavePlan global,
      BuildGlobalSavePlan(std::move(local_plans), data, policy(),
                          options_.require_full_coverage));
  global.metadata.storage_meta = storage_meta_;
  return GlobalResult{std::move(global.plans),
                      std::make_shared<Metadata>(std::move(global.metadata)),
                      /*cached=*/false};
}

absl::StatusOr<DefaultSavePlanner::GlobalResult>
DefaultSavePlanner::CreateCachedGlobalPlan(std::vector<SavePlan> local_plans,
                                           std::vector<SavePlannerData> data) {
  if (cache_ == nullptr) {
    cache_ = options_.plan_cache != nullptr ? options_.plan_cache
                                            : SavePlanCache::ProcessDefault();
  }
  const size_t n = local_plans.size();
  absl::MutexLock lock(&cache_->mutex());
  // The global key: every rank's digest, and the dedup policy.
  std::string key_bytes;
  key_bytes.reserve(n * 16 + 1);
  for (size_t r = 0; r < n; ++r) {
    const PlanDigest& d = *data[r].digest;
    key_bytes.append(reinterpret_cast<const char*>(&d.high), 8);
    key_bytes.append(reinterpret_cast<const char*>(&d.low), 8);
    auto& rank_cache = cache_->coordinator_rank(r);
    if (data[r].unchanged) {
      if (rank_cache.Find(d) == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", r,
            " sent an unchanged-plan marker for a plan the coordinator has "
            "not cached (was the coordinator restarted?); save again with "
            "plan caching off"));
      }
    } else {
      SavePlanCache::CoordinatorRankEntry entry;
      entry.local_plan.items = std::move(local_plans[r].items);
      entry.planner_data = std::move(data[r]);
      rank_cache.Put(d, std::move(entry));
    }
  }
  key_bytes.push_back(static_cast<char>(policy()));
  const PlanDigest key = DigestBytes(key_bytes);

  SavePlanCache::GlobalEntry* global = cache_->coordinator_globals().Find(key);
  if (global == nullptr) {
    std::vector<SavePlan> plans(n);
    std::vector<SavePlannerData> cached_data(n);
    for (size_t r = 0; r < n; ++r) {
      const auto* entry = cache_->coordinator_rank(r).Find(*data[r].digest);
      plans[r].items = entry->local_plan.items;
      cached_data[r] = entry->planner_data;
    }
    DCP_ASSIGN_OR_RETURN(
        GlobalSavePlan built,
        BuildGlobalSavePlan(std::move(plans), cached_data, policy(),
                            options_.require_full_coverage));
    SavePlanCache::GlobalEntry entry;
    entry.final_digests.resize(n);
    for (size_t r = 0; r < n; ++r) {
      // The final plan is a function of all local plans and the rank.
      entry.final_digests[r] = DigestBytes(absl::StrCat(key_bytes, "#", r));
    }
    entry.final_plans = std::move(built.plans);
    entry.metadata = std::make_shared<Metadata>(std::move(built.metadata));
    global = &cache_->coordinator_globals().Put(key, std::move(entry));
  }

  std::vector<SavePlan> out(n);
  for (size_t r = 0; r < n; ++r) {
    auto* rank_entry = cache_->coordinator_rank(r).Find(*data[r].digest);
    const PlanDigest& final_digest = global->final_digests[r];
    SavePlannerData out_data;
    out_data.digest = final_digest;
    if (data[r].unchanged && rank_entry->final_sent == final_digest) {
      out_data.unchanged = true;
    } else {
      out[r].items = global->final_plans[r].items;
    }
    rank_entry->final_sent = final_digest;
    out[r].planner_data = EncodeSavePlannerData(out_data);
    out[r].storage_data = std::move(local_plans[r].storage_data);
  }
  // The cached metadata, with this save's storage_meta. When the cache is
  // its only owner it is updated in place (the fence orders this after the
  // last release by an earlier holder, on any thread); when an earlier
  // caller still holds it, that caller's copy stays as it was.
  std::shared_ptr<Metadata>& metadata = global->metadata;
  if (metadata.use_count() == 1) {
    std::atomic_thread_fence(std::memory_order_acquire);
  } else {
    metadata = std::make_shared<Metadata>(*metadata);
  }
  metadata->storage_meta = storage_meta_;
  return GlobalResult{std::move(out), metadata, /*cached=*/true};
}

absl::StatusOr<SavePlan> DefaultSavePlanner::FinishPlan(SavePlan central_plan) {
  if (!local_digest_.has_value() || central_plan.planner_data.empty()) {
    return central_plan;
  }
  DCP_ASSIGN_OR_RETURN(SavePlannerData data,
                       DecodeSavePlannerData(central_plan.planner_data));
  if (!data.digest.has_value()) return central_plan;
  absl::MutexLock lock(&cache_->mutex());
  if (!data.unchanged) {
    cache_->rank_finals().Put(*local_digest_, {*data.digest, central_plan});
    return central_plan;
  }
  SavePlanCache::FinalEntry* entry = cache_->rank_finals().Find(*local_digest_);
  if (entry == nullptr || entry->final_digest != *data.digest) {
    return absl::FailedPreconditionError(
        "the coordinator sent an unchanged-plan marker for a final plan this "
        "rank does not hold (a previous save failed midway?); save again "
        "with plan caching off");
  }
  SavePlan plan = entry->final_plan;
  plan.storage_data = std::move(central_plan.storage_data);
  return plan;
}

absl::StatusOr<WriteValue> DefaultSavePlanner::ResolveData(
    const WriteItem& item) {
  if (item.type == WriteItemType::kBytesIO) {
    auto it = encoded_values_.find(item.index.fqn);
    if (it == encoded_values_.end()) {
      return absl::NotFoundError(absl::StrCat("value \"", item.index.fqn,
                                              "\" is not in this rank's plan"));
    }
    return WriteValue(it->second);
  }
  auto not_planned = [&] {
    return absl::NotFoundError(absl::StrCat(
        "tensor chunk ", item.index.ToString(), " is not in this rank's plan"));
  };
  auto it = planned_.find(item.index.fqn);
  if (it == planned_.end() || !item.index.offset.has_value()) {
    return not_planned();
  }
  const Shape& offset = *item.index.offset;
  const Tensor* found = nullptr;
  if (it->second->is_tensor()) {
    const Tensor& t = it->second->tensor();
    if (offset.size() == t.sizes().size() &&
        std::all_of(offset.begin(), offset.end(),
                    [](int64_t o) { return o == 0; })) {
      found = &t;
    }
  } else {
    const ShardedTensor& st = it->second->sharded_tensor();
    for (const Shard& shard : st.local_shards()) {
      if (shard.offsets == offset && !UnplannedShard(st, shard)) {
        found = &shard.tensor;
        break;
      }
    }
  }
  if (found == nullptr) return not_planned();
  const Tensor& tensor = *found;
  // A strided device view is the writer's to gather: only it holds the
  // device runtime and the caller's stream rule.
  if (tensor.view().is_contiguous() || !tensor.device().is_cpu()) {
    return WriteValue(tensor);
  }
  DCP_ASSIGN_OR_RETURN(Tensor copy, tensor.ContiguousHostCopy());
  return WriteValue(std::move(copy));
}

// ---------------------------------------------------------------------------
// DefaultLoadPlanner

DefaultLoadPlanner::DefaultLoadPlanner(DefaultLoadPlannerOptions options)
    : options_(std::move(options)) {}

absl::Status DefaultLoadPlanner::SetUp(StateDict* state_dict,
                                       const Metadata& metadata,
                                       bool is_coordinator) {
  if (state_dict == nullptr) {
    return absl::InvalidArgumentError("load into a null state dict");
  }
  state_dict_ = state_dict;
  metadata_ = &metadata;
  is_coordinator_ = is_coordinator;
  destinations_.clear();
  value_destinations_.clear();
  conversions_.clear();
  absl::MutexLock lock(&mu_);
  temporaries_.clear();
  temporary_bytes_ = 0;
  peak_temporary_bytes_ = 0;
  return absl::OkStatus();
}

namespace {

absl::Status CheckTensorMatches(const std::string& name, DType dtype,
                                const Shape& size,
                                const TensorStorageMetadata& saved) {
  if (saved.properties.dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", name, "\": the state dict has dtype ", DTypeName(dtype),
        " but the checkpoint has ", DTypeName(saved.properties.dtype),
        "; convert the tensor or load into a ",
        DTypeName(saved.properties.dtype), " tensor"));
  }
  if (saved.size != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", name, "\": the state dict has shape ", ShapeToString(size),
        " but the checkpoint has ", ShapeToString(saved.size)));
  }
  return absl::OkStatus();
}

// Whether a tensor of `dtype` whose chunks are `views` (host or device)
// loads the saved `saved` dtype by conversion under convert_dtypes; device
// chunks only when `device` (a DeviceConvert is set).
bool Converts(bool convert_dtypes, bool device, DType dtype, DType saved,
              const std::vector<const TensorView*>& views) {
  return convert_dtypes && dtype != saved && IsConvertibleFloat(dtype) &&
         IsConvertibleFloat(saved) &&
         std::all_of(views.begin(), views.end(), [device](const TensorView* v) {
           return v->device().is_cpu() || (device && v->device().is_cuda());
         });
}

Shape Minus(const Shape& a, const Shape& b) {
  Shape out(a.size());
  for (size_t d = 0; d < a.size(); ++d) out[d] = a[d] - b[d];
  return out;
}

// For a missing-key error: where the checkpoint holds something else at a
// missing name (a list or dict saved where the state dict has a value, or a
// value where it has a list or dict), what; else the one saved name that is
// the first missing one a key deeper or shallower (and not a name
// `in_state_dict`); else "".
std::string SavedInstead(
    const std::vector<std::string>& missing, const Metadata& metadata,
    const std::function<bool(const std::string&)>& in_state_dict) {
  const auto& items = metadata.state_dict_metadata;
  for (const std::string& name : missing) {
    const std::string prefix = name + ".";
    const auto below = items.lower_bound(prefix);
    if (below != items.end() && below->first.starts_with(prefix)) {
      return absl::StrCat(" (the checkpoint holds \"", below->first,
                          "\": a list or dict was saved at \"", name,
                          "\" where the state dict has a value)");
    }
    for (size_t dot = name.rfind('.'); dot != std::string::npos && dot > 0;
         dot = name.rfind('.', dot - 1)) {
      const std::string parent = name.substr(0, dot);
      if (items.count(parent) != 0) {
        return absl::StrCat(" (the checkpoint holds a single value at \"",
                            parent,
                            "\" where the state dict has a list or dict)");
      }
    }
  }
  // The same name nested one key deeper or shallower: a state dict (or a
  // checkpoint) wrapped as {"model": ...} on one side only. Named only
  // where one saved name fits and the state dict does not hold it itself.
  const std::string& first = missing.front();
  const std::string deeper = "." + first;
  const std::string* only = nullptr;
  int fits = 0;
  for (const auto& [saved, entry] : items) {
    if (!saved.ends_with(deeper) || in_state_dict(saved)) continue;
    const std::string_view outer(saved.data(), saved.size() - deeper.size());
    if (outer.empty() || outer.find('.') != std::string_view::npos) continue;
    only = &saved;
    if (++fits > 1) break;
  }
  if (fits == 1) {
    return absl::StrCat(" (the checkpoint holds \"", *only,
                        "\": saved under the key \"",
                        only->substr(0, only->size() - deeper.size()),
                        "\", which the state dict lacks?)");
  }
  const size_t dot = first.find('.');
  if (dot != std::string::npos) {
    const std::string inner = first.substr(dot + 1);
    if (items.count(inner) != 0 && !in_state_dict(inner)) {
      return absl::StrCat(" (the checkpoint holds \"", inner,
                          "\": saved without the key \"", first.substr(0, dot),
                          "\" of the state dict?)");
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<LoadPlan> DefaultLoadPlanner::CreateLocalPlan() {
  if (state_dict_ == nullptr || metadata_ == nullptr) {
    return absl::FailedPreconditionError("CreateLocalPlan before SetUp");
  }
  DCP_ASSIGN_OR_RETURN(
      auto leaves, LeavesInPlace(*state_dict_, options_.flatten_state_dict));
  destinations_.clear();
  value_destinations_.clear();
  conversions_.clear();
  {
    absl::MutexLock lock(&mu_);
    temporaries_.clear();
    temporary_bytes_ = 0;
  }
  destinations_.reserve(leaves.size());
  LoadPlan plan;
  std::vector<std::string> missing;
  // Per tensor, reused: the requested chunks and their memory, and the
  // saved boxes they read (owners[k]: the requested chunk of overlaps[k]).
  std::vector<ChunkStorageMetadata> requested;
  std::vector<const TensorView*> views;
  std::vector<ChunkOverlap> overlaps;
  std::vector<size_t> owners;
  std::vector<size_t> fallback;
  plan.items.reserve(leaves.size());
  for (const auto& [name, leaf] : leaves) {
    const StateValue& value = *leaf;
    auto it = metadata_->state_dict_metadata.find(name);
    if (it == metadata_->state_dict_metadata.end()) {
      // Shards that hold no elements need nothing from storage (a rank-local
      // checkpoint of a rank with an empty shard does not list the tensor).
      const bool holds_nothing =
          value.is_sharded_tensor() &&
          std::all_of(value.sharded_tensor().local_shards().begin(),
                      value.sharded_tensor().local_shards().end(),
                      [](const Shard& s) { return s.tensor.numel() == 0; });
      if (!holds_nothing) missing.push_back(name);
      continue;
    }
    const auto* saved = std::get_if<TensorStorageMetadata>(&it->second);
    const bool is_tensor = value.is_tensor() || value.is_sharded_tensor();
    if (is_tensor != (saved != nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", name, "\" is a ", StateKindName(value.kind()),
                       " in the state dict but a ",
                       saved != nullptr ? "tensor" : "non-tensor value",
                       " in the checkpoint"));
    }
    if (!is_tensor) {
      value_destinations_.emplace(name, leaf);
      ReadItem item;
      item.type = LoadItemType::kBytesIO;
      item.dest_index = MetadataIndex(name);
      item.storage_index = MetadataIndex(name);
      plan.items.push_back(std::move(item));
      continue;
    }
    requested.clear();
    views.clear();
    const DType saved_dtype = saved->properties.dtype;
    bool converts = false;
    if (value.is_tensor()) {
      const Tensor& t = value.tensor();
      converts = Converts(options_.convert_dtypes, device_convert_ != nullptr,
                          t.dtype(), saved_dtype, {&t.view()});
      DCP_RETURN_IF_ERROR(CheckTensorMatches(
          name, converts ? saved_dtype : t.dtype(), t.sizes(), *saved));
      requested.push_back({Zeros(t.sizes().size()), t.sizes()});
      views.push_back(&t.view());
    } else {
      const ShardedTensor& st = value.sharded_tensor();
      DCP_RETURN_IF_ERROR(st.Validate(name));
      std::vector<const TensorView*> shard_views;
      for (const Shard& shard : st.local_shards()) {
        shard_views.push_back(&shard.tensor.view());
      }
      converts = Converts(options_.convert_dtypes, device_convert_ != nullptr,
                          st.dtype(), saved_dtype, shard_views);
      DCP_RETURN_IF_ERROR(
          CheckTensorMatches(name, converts ? saved_dtype : st.dtype(),
                             st.global_sizes(), *saved));
      // Destinations are found by offset: two shards at one offset would
      // both resolve to the first.
      if (std::optional<Shape> repeated = RepeatedOffsets(st)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sharded tensor \"", name, "\" has two local shards at offsets ",
            ShapeToString(*repeated)));
      }
      for (const Shard& shard : st.local_shards()) {
        if (UnplannedShard(st, shard)) continue;  // Nothing to read.
        requested.push_back({shard.offsets, shard.tensor.sizes()});
        views.push_back(&shard.tensor.view());
      }
    }
    // A destination whose elements share memory would take several saved
    // elements in one place, whichever landed last.
    for (const TensorView* v : views) {
      if (v->may_overlap()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"", name, "\": the destination's elements share memory (sizes ",
            ShapeToString(v->sizes()), ", strides ",
            ShapeToString(v->strides()),
            "); load into a tensor whose elements do not overlap"));
      }
    }
    // The saved boxes each requested chunk reads: by binary search for the
    // usual layouts, else by the sweep, which handles any layout and finds
    // chunks the saved list does not cover.
    overlaps.clear();
    owners.clear();
    fallback.clear();
    for (size_t r = 0; r < requested.size(); ++r) {
      if (FindCoveringChunks(requested[r], saved->chunks, &overlaps)) {
        owners.resize(overlaps.size(), r);
      } else {
        fallback.push_back(r);
      }
    }
    if (!fallback.empty()) {
      std::vector<ChunkStorageMetadata> rest;
      rest.reserve(fallback.size());
      for (size_t r : fallback) rest.push_back(requested[r]);
      std::vector<int64_t> covered(rest.size(), 0);
      // Each request's boxes, relative to it: they must tile it exactly.
      std::vector<std::vector<ChunkStorageMetadata>> parts(rest.size());
      std::vector<std::vector<size_t>> part_sources(rest.size());
      ForEachOverlap(rest, saved->chunks,
                     [&](size_t i, size_t s, const ChunkStorageMetadata& box) {
                       covered[i] += ChunkVolume(box);
                       parts[i].push_back(
                           {Minus(box.offsets, rest[i].offsets), box.sizes});
                       part_sources[i].push_back(s);
                       overlaps.push_back({s, box});
                       owners.push_back(fallback[i]);
                     });
      for (size_t i = 0; i < rest.size(); ++i) {
        if (covered[i] != ChunkVolume(rest[i])) {
          const std::string held =
              absl::StrCat("tensor \"", name, "\": the checkpoint holds ",
                           covered[i], " of ", ChunkVolume(rest[i]),
                           " elements of the requested chunk [",
                           ChunkToString(rest[i]), "]");
          // One rank's part of a rank-local save, loaded by itself.
          if (metadata_->rank_local.has_value()) {
            return absl::InvalidArgumentError(absl::StrCat(
                held, ": it is rank ", metadata_->rank_local->rank,
                "'s checkpoint of a rank-local save of ",
                metadata_->rank_local->world_size,
                " ranks (use_collectives=false), which holds that rank's "
                "shards only; load the save's directory on as many ranks"));
          }
          return absl::DataLossError(absl::StrCat(
              held, "; its chunk list is incomplete (damaged metadata?)"));
        }
        // Volumes that add up can still hide a gap behind saved chunks
        // that overlap each other.
        absl::Status tiled =
            ValidateTiling(name, rest[i].sizes, parts[i], [&](size_t k) {
              return absl::StrCat(
                  "saved chunk [",
                  ChunkToString(saved->chunks[part_sources[i][k]]), "]");
            });
        if (!tiled.ok()) {
          return absl::DataLossError(absl::StrCat(
              "the checkpoint's chunks of tensor \"", name,
              "\" overlap (damaged metadata?): ", tiled.message()));
        }
      }
    }
    const size_t first_item = plan.items.size();
    for (size_t k = 0; k < overlaps.size(); ++k) {
      const ChunkStorageMetadata& dest = requested[owners[k]];
      const size_t s = overlaps[k].saved;
      const ChunkStorageMetadata& src = saved->chunks[s];
      ChunkStorageMetadata& box = overlaps[k].box;
      ReadItem item;
      item.type = LoadItemType::kTensor;
      item.dest_index = MetadataIndex(name, dest.offsets);
      item.dest_offsets = Minus(box.offsets, dest.offsets);
      item.storage_index =
          MetadataIndex(name, src.offsets, static_cast<int64_t>(s));
      item.storage_offsets = Minus(box.offsets, src.offsets);
      item.lengths = std::move(box.sizes);
      plan.items.push_back(std::move(item));
    }
    // Deterministic order: by destination chunk, then stored chunk.
    std::sort(plan.items.begin() + first_item, plan.items.end(),
              [](const ReadItem& a, const ReadItem& b) {
                if (a.dest_index.offset != b.dest_index.offset) {
                  return a.dest_index.offset < b.dest_index.offset;
                }
                return a.storage_index.offset < b.storage_index.offset;
              });
    for (size_t r = 0; r < requested.size(); ++r) {
      MetadataIndex index(name, requested[r].offsets);
      if (converts) {
        conversions_.emplace(
            index,
            Conversion{views[r], saved_dtype, 0,
                       static_cast<int64_t>(NumElements(views[r]->sizes()) *
                                            ElementSize(saved_dtype))});
      }
      destinations_.emplace(std::move(index), views[r]);
    }
  }
  if (!missing.empty() && !options_.allow_partial_load) {
    constexpr size_t kListed = 10;
    std::vector<std::string> listed(
        missing.begin(), missing.begin() + std::min(missing.size(), kListed));
    return absl::NotFoundError(absl::StrCat(
        "the checkpoint has no \"", absl::StrJoin(listed, "\", \""), "\"",
        missing.size() > kListed
            ? absl::StrCat(" (and ", missing.size() - kListed, " more)")
            : "",
        "; load with allow_partial_load to skip missing keys",
        SavedInstead(listed, *metadata_, [&](const std::string& name) {
          for (const auto& [leaf_name, leaf] : leaves) {
            if (leaf_name == name) return true;
          }
          return false;
        })));
  }
  CountConversionItems(plan);
  return plan;
}

absl::StatusOr<std::vector<LoadPlan>> DefaultLoadPlanner::CreateGlobalPlan(
    std::vector<LoadPlan> local_plans) {
  if (!options_.dedup_reads || metadata_ == nullptr) return local_plans;
  return BuildGlobalLoadPlan(std::move(local_plans), *metadata_);
}

void DefaultLoadPlanner::CountConversionItems(const LoadPlan& plan) {
  if (conversions_.empty()) return;
  for (auto& [index, conversion] : conversions_) conversion.items = 0;
  for (const ReadItem& item : plan.items) {
    if (item.type != LoadItemType::kTensor) continue;
    auto it = conversions_.find(item.dest_index);
    if (it != conversions_.end()) ++it->second.items;
  }
}

absl::StatusOr<LoadPlan> DefaultLoadPlanner::FinishPlan(LoadPlan central_plan) {
  CountConversionItems(central_plan);
  return central_plan;
}

absl::Status DefaultLoadPlanner::LoadBytes(const ReadItem& item,
                                           absl::string_view bytes) {
  auto it = value_destinations_.find(item.dest_index.fqn);
  if (it == value_destinations_.end()) {
    return absl::NotFoundError(absl::StrCat("value \"", item.dest_index.fqn,
                                            "\" is not in this rank's plan"));
  }
  // A reader thread calls this: a value too large for memory must come
  // back as an error, not a std::bad_alloc nothing there would catch.
  try {
    absl::StatusOr<StateValue> value = DecodeValue(bytes);
    if (!value.ok()) {
      return Annotate(value.status(),
                      absl::StrCat("value \"", item.dest_index.fqn, "\""));
    }
    *it->second = std::move(*value);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes.size(), " bytes for value \"",
                     item.dest_index.fqn, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorView> DefaultLoadPlanner::ResolveTensor(
    const ReadItem& item) {
  auto it = destinations_.find(item.dest_index);
  if (it == destinations_.end()) {
    return absl::NotFoundError(absl::StrCat("destination chunk ",
                                            item.dest_index.ToString(),
                                            " is not in this rank's plan"));
  }
  auto conversion = conversions_.find(item.dest_index);
  if (conversion == conversions_.end()) return *it->second;
  const Conversion& c = conversion->second;
  absl::MutexLock lock(&mu_);
  Temporary& temporary = temporaries_[item.dest_index];
  if (temporary.buffer == nullptr) {
    // Uninitialised: the chunk's items write every element before the
    // last commit converts it.
    constexpr std::align_val_t kAlignment{4096};  // For O_DIRECT reads.
    try {
      temporary.buffer = std::shared_ptr<std::byte>(
          static_cast<std::byte*>(::operator new(
              static_cast<size_t>(std::max<int64_t>(c.bytes, 1)), kAlignment)),
          [](std::byte* p) { ::operator delete(p, kAlignment); });
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", c.bytes, " bytes to convert ",
                       item.dest_index.ToString(), " from ", DTypeName(c.saved),
                       " to ", DTypeName(c.dest->dtype())));
    }
    temporary_bytes_ += c.bytes;
    peak_temporary_bytes_ = std::max(peak_temporary_bytes_, temporary_bytes_);
  }
  return TensorView(temporary.buffer.get(), c.saved, c.dest->sizes());
}

int64_t DefaultLoadPlanner::TemporaryBytes(const ReadItem& item) const {
  auto it = conversions_.find(item.dest_index);
  if (it == conversions_.end()) return 0;
  const Conversion& c = it->second;
  const int64_t items = std::max<int64_t>(c.items, 1);
  return (c.bytes + items - 1) / items;
}

absl::Status DefaultLoadPlanner::CommitTensor(const ReadItem& item,
                                              const TensorView& tensor) {
  auto conversion = conversions_.find(item.dest_index);
  if (conversion == conversions_.end()) return absl::OkStatus();
  const Conversion& c = conversion->second;
  std::shared_ptr<std::byte> buffer;
  {
    absl::MutexLock lock(&mu_);
    auto it = temporaries_.find(item.dest_index);
    if (it == temporaries_.end() || it->second.buffer == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("commit of ", item.dest_index.ToString(),
                       " before its ResolveTensor"));
    }
    if (++it->second.committed < c.items) return absl::OkStatus();
    buffer = std::move(it->second.buffer);
    temporaries_.erase(it);
    temporary_bytes_ -= c.bytes;
  }
  return Annotate(c.dest->device().is_cpu()
                      ? ConvertInto(buffer.get(), c.saved, *c.dest)
                      : device_convert_(buffer.get(), c.saved, *c.dest),
                  absl::StrCat("converting ", item.dest_index.ToString()));
}

void DefaultLoadPlanner::SetDeviceConversion(DeviceConvert convert) {
  device_convert_ = std::move(convert);
}

int64_t DefaultLoadPlanner::peak_temporary_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_temporary_bytes_;
}

}  // namespace dcp
