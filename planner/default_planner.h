// DefaultSavePlanner and DefaultLoadPlanner: the seed's default planners.
//
// Save: every rank plans one WriteItem per tensor (kTensor: the whole
// tensor, index offset all zeros), per local shard of a sharded tensor
// (kShard: index offset = the shard's offsets) and per non-tensor value
// (kBytesIO, encoded as in planner/value_codec.h). The coordinator
// deduplicates replicated items (see DedupPolicy), validates the layout and
// builds the Metadata (planner/global_save_plan.h).
//
// Load: every rank intersects the chunks it wants (each tensor whole, each
// local shard of a sharded tensor) with the chunks that were saved and reads
// only the overlapping boxes, so any saved layout loads into any requested
// layout (N-d, uneven, zero-size dimensions).
#ifndef DCP_PLANNER_DEFAULT_PLANNER_H_
#define DCP_PLANNER_DEFAULT_PLANNER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "planner/global_save_plan.h"
#include "planner/metadata.h"
#include "planner/plan.h"
#include "planner/plan_cache.h"
#include "planner/plan_codec.h"
#include "planner/planner.h"

namespace dcp {

// The seed's DefaultSavePlanner keyword arguments.
struct DefaultSavePlannerOptions {
  // Flatten nested dicts/lists into dotted names; the mapping is stored in
  // Metadata::flatten_mapping. When false, every top-level value must be a
  // leaf (nested containers cannot be stored without flattening:
  // kInvalidArgument).
  bool flatten_state_dict = true;
  // Accepted for the seed's API. dcp's ShardedTensor never nests, so its
  // shards are always saved as chunks of the one global tensor.
  bool flatten_sharded_tensors = true;
  // Accepted for the seed's API (deprecated there). Replicated items are
  // always deduplicated: the metadata records one location per item, so two
  // ranks can never both write it.
  std::optional<bool> dedup_replicated_tensors;
  // Who writes a replicated item: the lowest rank holding it (true), or the
  // holder that balances bytes per rank (false, the default).
  bool dedup_save_to_lowest_rank = false;
  // Reuse plans across saves whose local plans are unchanged: an unchanged
  // rank sends only a marker, and the coordinator reuses its cached global
  // plan and metadata (planner/plan_cache.h).
  bool enable_plan_caching = false;
  // Require the saved chunks of each tensor to cover it. The engine turns
  // this off for rank-local saves (use_collectives=false), where each rank's
  // checkpoint holds only its own shards.
  bool require_full_coverage = true;
  // Flattened names of the tensors whose metadata records requires_grad
  // (the seed reads it off torch tensors; dcp's Tensor carries no autograd
  // state, so callers that have it, like the C ABI, name them here).
  std::set<std::string> requires_grad;
  // The cache used when enable_plan_caching is on, one per rank (tests
  // simulating many ranks in one process give each its own). When null, a
  // process-wide cache is used.
  std::shared_ptr<SavePlanCache> plan_cache;
};

class DefaultSavePlanner : public SavePlanner {
 public:
  explicit DefaultSavePlanner(DefaultSavePlannerOptions options = {});

  // Flattens `state_dict` (keeping the tensors' memory shared with it).
  // kInvalidArgument for colliding flattened names, a sharded tensor whose
  // shards do not fit it, or nesting without flatten_state_dict.
  absl::Status SetUp(const StateDict& state_dict,
                     const StorageMeta& storage_meta,
                     bool is_coordinator) override;

  // Items in flattened-name order; planner_data holds the flatten mapping.
  // With plan caching, a plan equal to this rank's previous one is returned
  // as an "unchanged" marker (IsUnchangedSavePlan) instead.
  absl::StatusOr<SavePlan> CreateLocalPlan() override;

  // See BuildGlobalSavePlan. With plan caching, when every rank's plan is
  // unchanged (or equal to a cached one) the cached result is reused and
  // ranks whose final plan is unchanged get a marker back.
  absl::StatusOr<std::pair<std::vector<SavePlan>, Metadata>> CreateGlobalPlan(
      std::vector<SavePlan> local_plans) override;

  // As CreateGlobalPlan. With plan caching the metadata is the cached one
  // itself (no copy): a cached re-plan then costs O(ranks), not O(items).
  absl::StatusOr<SharedGlobalSavePlan> CreateSharedGlobalPlan(
      std::vector<SavePlan> local_plans) override;

  // Resolves a marker to this rank's cached final plan (keeping the
  // marker's storage_data). kFailedPrecondition for a marker this rank has
  // no cached plan for.
  absl::StatusOr<SavePlan> FinishPlan(SavePlan central_plan) override;

  // kTensor/kShard: the chunk as a contiguous Tensor. A contiguous tensor is
  // returned as is (memory shared with the state dict); a non-contiguous
  // host tensor is copied into a new contiguous host tensor; a
  // non-contiguous device tensor is kInvalidArgument (stage it first).
  // kBytesIO: the encoded value. kNotFound for an item this planner did not
  // plan. Thread-safe after CreateLocalPlan.
  absl::StatusOr<WriteValue> ResolveData(const WriteItem& item) override;

  // The flattened leaves being saved.
  const std::map<std::string, StateValue>& leaves() const { return leaves_; }

 private:
  // A global plan; `cached`: the plan cache holds `metadata` too.
  struct GlobalResult {
    std::vector<SavePlan> plans;
    std::shared_ptr<Metadata> metadata;
    bool cached = false;
  };

  // The local plan's items; the unheld tensors go to `data->unheld`.
  absl::StatusOr<SavePlan> BuildLocalPlan(SavePlannerData* data);
  absl::StatusOr<GlobalResult> BuildGlobal(std::vector<SavePlan> local_plans);
  absl::StatusOr<GlobalResult> CreateCachedGlobalPlan(
      std::vector<SavePlan> local_plans, std::vector<SavePlannerData> data);
  DedupPolicy policy() const;

  DefaultSavePlannerOptions options_;
  std::shared_ptr<SavePlanCache> cache_;
  std::optional<PlanDigest> local_digest_;  // Of the last local plan.
  StorageMeta storage_meta_;
  bool is_coordinator_ = false;
  std::map<std::string, StateValue> leaves_;
  FlattenMapping mapping_;
  // Filled by CreateLocalPlan, read-only afterwards: the planned tensor and
  // sharded tensor leaves by name (keys and values live in leaves_).
  absl::flat_hash_map<absl::string_view, const StateValue*> planned_;
  absl::flat_hash_map<std::string, std::string> encoded_values_;
};

// The seed's DefaultLoadPlanner keyword arguments.
struct DefaultLoadPlannerOptions {
  // Match the destination's flattened names against the checkpoint's. When
  // false, every top-level value must be a leaf.
  bool flatten_state_dict = true;
  // Accepted for the seed's API (see DefaultSavePlannerOptions).
  bool flatten_sharded_tensors = true;
  // Skip destination keys the checkpoint lacks instead of failing.
  bool allow_partial_load = false;
  // Let CreateGlobalPlan assign each stored item that several ranks need to
  // one reader (see LoadPlan::read_for_peers). Only annotates the plans:
  // every rank keeps the items it needs.
  bool dedup_reads = true;
  // Load a floating-point tensor (F64, F32, BF16, F16) saved as another of
  // those dtypes by converting it as torch's copy_ does
  // (core/dtype_convert.h). Host destinations, and device destinations
  // once DefaultLoadPlanner::SetDeviceConversion gave a way there; other
  // device destinations of another dtype are refused as without this
  // option. Each converted
  // destination chunk is read into a temporary of the saved dtype
  // (ResolveTensor), converted into the destination when its last box
  // arrives and freed (CommitTensor): a reader that plans items as it
  // reads them and counts TemporaryBytes against its read window (the
  // FileSystem and Hugging Face readers) holds about two windows of them.
  bool convert_dtypes = false;
};

class DefaultLoadPlanner : public LoadPlanner {
 public:
  explicit DefaultLoadPlanner(DefaultLoadPlannerOptions options = {});

  // Keeps `state_dict` and a pointer to `metadata`: both must outlive the
  // load. kInvalidArgument as for DefaultSavePlanner::SetUp.
  absl::Status SetUp(StateDict* state_dict, const Metadata& metadata,
                     bool is_coordinator) override;

  // One ReadItem per (requested chunk, saved chunk) pair that share
  // elements, offsets relative to each chunk; one kBytesIO item per
  // non-tensor leaf. Checkpoint keys the state dict lacks are ignored.
  // Errors: kNotFound naming the missing keys (unless allow_partial_load);
  // kInvalidArgument naming the key and both dtypes, both shapes, or both
  // kinds (tensor / value) on a mismatch; kDataLoss when the saved chunks do
  // not hold every requested element.
  absl::StatusOr<LoadPlan> CreateLocalPlan() override;

  // With dedup_reads: fills read_for_peers / received_from (see
  // BuildGlobalLoadPlan); items are unchanged.
  absl::StatusOr<std::vector<LoadPlan>> CreateGlobalPlan(
      std::vector<LoadPlan> local_plans) override;

  absl::StatusOr<LoadPlan> FinishPlan(LoadPlan central_plan) override;

  // Decodes the value and replaces the leaf in the caller's state dict.
  // kDataLoss for bytes that do not decode; kNotFound for an unplanned item.
  absl::Status LoadBytes(const ReadItem& item,
                         absl::string_view bytes) override;

  // The destination chunk `item.dest_index`: the caller's tensor (or shard)
  // memory itself, with its own strides (a reader copying a box at
  // dest_offsets must honour them). For a chunk that converts
  // (convert_dtypes): a contiguous host temporary of the saved dtype,
  // shaped as the chunk, allocated by the first call for any of its items
  // (kResourceExhausted naming the tensor when the memory is not there).
  // kNotFound for an unplanned chunk.
  absl::StatusOr<TensorView> ResolveTensor(const ReadItem& item) override;

  // For an item of a chunk that converts, its share of the chunk's
  // temporary (the bytes divided among the chunk's items, so a reader
  // counting every item counts the temporary once); else 0.
  int64_t TemporaryBytes(const ReadItem& item) const override;

  // For a chunk that converts, once every item FinishPlan planned into it
  // has been committed: converts the temporary into the destination and
  // frees it. Otherwise a no-op (the destination was written in place).
  absl::Status CommitTensor(const ReadItem& item,
                            const TensorView& tensor) override;

  // The most temporary bytes (convert_dtypes) held at once since SetUp.
  int64_t peak_temporary_bytes() const;

  // Converts the contiguous row-major array `src` of `from` elements, shaped
  // as `dst`, into `dst`, memory of a device (staging/device_box_upload.h's
  // ConvertUpload, bound to the reader's DeviceStaging). `src` may be freed
  // once it returns; the values may land later, before the reader's
  // ReadData completes. Called from reader threads, concurrently.
  using DeviceConvert = std::function<absl::Status(
      const std::byte* src, DType from, const TensorView& dst)>;
  // With convert_dtypes, device destinations of another convertible dtype
  // load too: each chunk is read into a host temporary of the saved dtype,
  // as for host destinations, which `convert` takes to the device when the
  // chunk's last item is committed. Call before CreateLocalPlan; without
  // it (the default) such destinations are refused.
  void SetDeviceConversion(DeviceConvert convert);

 private:
  // Sets each Conversion's item count from `plan`.
  void CountConversionItems(const LoadPlan& plan);

  // A destination chunk read through a temporary (convert_dtypes).
  struct Conversion {
    const TensorView* dest = nullptr;
    DType saved = DType::kF32;
    int64_t items = 0;  // Of the local plan, then of the finished one.
    int64_t bytes = 0;  // Of the temporary.
  };
  struct Temporary {
    std::shared_ptr<std::byte> buffer;
    int64_t committed = 0;
  };

  DefaultLoadPlannerOptions options_;
  DeviceConvert device_convert_;
  StateDict* state_dict_ = nullptr;
  const Metadata* metadata_ = nullptr;
  bool is_coordinator_ = false;
  // Filled by CreateLocalPlan, read-only afterwards. Both point into
  // *state_dict_ (LoadBytes assigns values, which moves no other leaf).
  absl::flat_hash_map<MetadataIndex, const TensorView*> destinations_;
  absl::flat_hash_map<std::string, StateValue*> value_destinations_;
  // Filled by CreateLocalPlan and FinishPlan, read-only afterwards.
  absl::flat_hash_map<MetadataIndex, Conversion> conversions_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<MetadataIndex, Temporary> temporaries_
      ABSL_GUARDED_BY(mu_);
  int64_t temporary_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_temporary_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dcp

#endif  // DCP_PLANNER_DEFAULT_PLANNER_H_
