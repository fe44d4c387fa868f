// The SavePlanner and LoadPlanner contracts of the seed. The engine drives
// them in this order on every rank:
//
//   save: SetUp -> CreateLocalPlan -> (coordinator) CreateGlobalPlan (or
//         CreateSharedGlobalPlan) ->
//         FinishPlan -> ResolveData per item while writing
//   load: SetUp -> CreateLocalPlan -> (coordinator) CreateGlobalPlan ->
//         FinishPlan -> LoadBytes / ResolveTensor + CommitTensor per item
//
// A planner instance serves one save or load at a time and is not
// thread-safe, except ResolveData, ResolveTensor, CommitTensor and LoadBytes,
// which the storage layer may call from several I/O threads at once for
// different items.
#ifndef DCP_PLANNER_PLANNER_H_
#define DCP_PLANNER_PLANNER_H_

#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/state_dict.h"
#include "core/tensor.h"
#include "planner/metadata.h"
#include "planner/plan.h"

namespace dcp {

// The data behind one WriteItem: a contiguous tensor chunk (host or device
// memory, owned by the state dict or the stager) or encoded bytes.
using WriteValue = std::variant<Tensor, std::string>;

// A global save plan whose metadata is shared (see
// SavePlanner::CreateSharedGlobalPlan). Nobody changes the metadata while
// another holder (a plan cache) shares it; a caller holding the only
// reference (use_count() == 1) owns it and may move it out.
struct SharedGlobalSavePlan {
  std::vector<SavePlan> plans;
  std::shared_ptr<Metadata> metadata;
};

class SavePlanner {
 public:
  virtual ~SavePlanner() = default;

  // Takes the state dict to save (the planner keeps it until the save ends).
  // `storage_meta` identifies the save; `is_coordinator` tells whether this
  // rank will run CreateGlobalPlan.
  virtual absl::Status SetUp(const StateDict& state_dict,
                             const StorageMeta& storage_meta,
                             bool is_coordinator) = 0;

  // This rank's plan: one item per tensor, shard chunk or non-tensor value.
  virtual absl::StatusOr<SavePlan> CreateLocalPlan() = 0;

  // Coordinator only: validates and deduplicates all ranks' plans, returns
  // each rank's final plan (same order as the input) and the global
  // metadata (storage_data still empty: the storage layer fills it from the
  // write results). kInvalidArgument naming tensor and ranks on bad plans.
  virtual absl::StatusOr<std::pair<std::vector<SavePlan>, Metadata>>
  CreateGlobalPlan(std::vector<SavePlan> local_plans) = 0;

  // CreateGlobalPlan with the metadata shared instead of returned by value
  // (same plans, metadata and errors): a planner that caches plans can hand
  // out its cached metadata without copying it, which at a million items
  // costs more than the rest of a cached re-plan. The metadata never changes
  // while the caller holds it. The default calls CreateGlobalPlan.
  virtual absl::StatusOr<SharedGlobalSavePlan> CreateSharedGlobalPlan(
      std::vector<SavePlan> local_plans) {
    absl::StatusOr<std::pair<std::vector<SavePlan>, Metadata>> global =
        CreateGlobalPlan(std::move(local_plans));
    if (!global.ok()) return global.status();
    return SharedGlobalSavePlan{
        std::move(global->first),
        std::make_shared<Metadata>(std::move(global->second))};
  }

  // Accepts the coordinator's plan for this rank.
  virtual absl::StatusOr<SavePlan> FinishPlan(SavePlan central_plan) = 0;

  // The data of `item` (thread-safe). Host tensor chunks are contiguous;
  // a device chunk may be a strided view, which the storage writer gathers
  // (it holds the device runtime) or refuses with kInvalidArgument.
  virtual absl::StatusOr<WriteValue> ResolveData(const WriteItem& item) = 0;
};

class LoadPlanner {
 public:
  virtual ~LoadPlanner() = default;

  // Takes the state dict to fill in place (tensors are written into their
  // memory; non-tensor values are replaced). The planner keeps references
  // to `state_dict` and `metadata`: both must outlive the load.
  virtual absl::Status SetUp(StateDict* state_dict, const Metadata& metadata,
                             bool is_coordinator) = 0;

  // Intersects what this rank wants with what was saved. Errors: kNotFound
  // for a missing key (unless partial load is allowed), kInvalidArgument for
  // a dtype or shape mismatch, naming the key.
  virtual absl::StatusOr<LoadPlan> CreateLocalPlan() = 0;

  // Coordinator only: may rewrite plans (read dedup); same order as input.
  virtual absl::StatusOr<std::vector<LoadPlan>> CreateGlobalPlan(
      std::vector<LoadPlan> local_plans) = 0;

  virtual absl::StatusOr<LoadPlan> FinishPlan(LoadPlan central_plan) = 0;

  // Delivers the stored bytes of a kBytesIO item (thread-safe).
  virtual absl::Status LoadBytes(const ReadItem& item,
                                 absl::string_view bytes) = 0;

  // The destination chunk `item.dest_index` (thread-safe): host memory the
  // reader copies the box into at `item.dest_offsets`.
  virtual absl::StatusOr<TensorView> ResolveTensor(const ReadItem& item) = 0;

  // The bytes of memory ResolveTensor(item) hands out that the planner
  // allocated for the load (a temporary CommitTensor frees), 0 when it
  // hands out the destination itself; where several items share one
  // temporary, each item's share. A reader that bounds the memory it holds
  // counts them. Thread-safe.
  virtual int64_t TemporaryBytes(const ReadItem& item) const { return 0; }

  // Called once the box of `item` has been copied into `tensor` (the view
  // ResolveTensor returned); a planner that resolved to a temporary copies it
  // to the final destination here (thread-safe).
  virtual absl::Status CommitTensor(const ReadItem& item,
                                    const TensorView& tensor) = 0;
};

}  // namespace dcp

#endif  // DCP_PLANNER_PLANNER_H_
