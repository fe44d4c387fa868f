// The coordinator's half of a load: read dedup. When several ranks need
// bytes of the same stored item (a replicated tensor loaded everywhere, or
// a saved chunk that straddles several requested chunks on different
// ranks), one of them is assigned to read it, and the plans record who
// receives it, so the storage layer can read once and share. Every rank
// keeps all of its ReadItems: the annotations are optional to honour.
#ifndef DCP_PLANNER_GLOBAL_LOAD_PLAN_H_
#define DCP_PLANNER_GLOBAL_LOAD_PLAN_H_

#include <vector>

#include "absl/status/statusor.h"
#include "planner/metadata.h"
#include "planner/plan.h"

namespace dcp {

// Fills read_for_peers / received_from of `plans` (rank r = plans[r]).
// Readers are chosen to balance bytes read per rank: bytes only one rank
// needs stay with it; shared items, largest first, go to the least-loaded
// rank needing them (lowest rank on ties). Item sizes come from `metadata`
// (storage_data lengths where present, else chunk sizes). Annotations are
// sorted by storage index. O(n log n) in the number of read items.
std::vector<LoadPlan> BuildGlobalLoadPlan(std::vector<LoadPlan> plans,
                                          const Metadata& metadata);

// Bytes each rank reads from storage under `plans`' annotations (a stored
// item counts once for its reader, and once for each rank needing it when
// not shared).
std::vector<int64_t> ReadBytesPerRank(const std::vector<LoadPlan>& plans,
                                      const Metadata& metadata);

}  // namespace dcp

#endif  // DCP_PLANNER_GLOBAL_LOAD_PLAN_H_
