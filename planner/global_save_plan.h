// The coordinator's half of a save: validates all ranks' local plans,
// deduplicates items that several ranks hold (replicated tensors and
// values), and builds the global Metadata. Pure logic over plans; runs in
// O(n log n) in the number of items.
#ifndef DCP_PLANNER_GLOBAL_SAVE_PLAN_H_
#define DCP_PLANNER_GLOBAL_SAVE_PLAN_H_

#include <vector>

#include "absl/status/statusor.h"
#include "planner/metadata.h"
#include "planner/plan.h"
#include "planner/plan_codec.h"

namespace dcp {

// Who writes an item that several ranks hold.
enum class DedupPolicy {
  // Balance bytes written per rank: items held by one rank stay there; the
  // rest, largest first, go to the least-loaded rank holding them (lowest
  // rank on ties). Deterministic.
  kBalanceBytes,
  // The lowest rank holding the item (the seed's dedup_save_to_lowest_rank).
  kLowestRank,
};

struct GlobalSavePlan {
  std::vector<SavePlan> plans;  // One per rank, same order as the input.
  Metadata metadata;            // storage_data and storage_meta left empty.
};

// `local_plans[r]` is rank r's plan, `data[r]` its decoded planner data
// (the flatten mapping; `data` may be empty when no rank flattened). Each
// final plan keeps the rank's items that it writes, in their original order,
// with `index.index` set to the chunk's position in the metadata (chunks of
// a tensor are sorted by offset); storage_data is carried over, planner_data
// is left empty (the mapping it held is in the metadata).
//
// Errors (kInvalidArgument, naming tensor, chunks and ranks):
// - ranks disagree on a name's kind (tensor or value), dtype, global shape,
//   or a replicated chunk's sizes;
// - a chunk lies outside its tensor, two chunks overlap, or the chunks do
//   not cover the tensor;
// - two ranks map the same flattened name to different paths.
absl::StatusOr<GlobalSavePlan> BuildGlobalSavePlan(
    std::vector<SavePlan> local_plans, const std::vector<SavePlannerData>& data,
    DedupPolicy policy);

}  // namespace dcp

#endif  // DCP_PLANNER_GLOBAL_SAVE_PLAN_H_
