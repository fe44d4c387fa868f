// Test support: runs the save and load flows of several simulated ranks
// through the planners, storing items in memory instead of files. Tensor
// boxes are copied element by element, honouring destination strides, as a
// storage reader would.
#ifndef DCP_PLANNER_IN_MEMORY_CHECKPOINT_H_
#define DCP_PLANNER_IN_MEMORY_CHECKPOINT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "planner/metadata.h"
#include "planner/planner.h"

namespace dcp {

struct InMemoryCheckpoint {
  Metadata metadata;
  absl::flat_hash_map<MetadataIndex, std::string> items;
  std::vector<std::vector<WriteItem>> written;  // By rank.
};

// Saves `state_dicts[r]` as rank r (rank 0 coordinates) with the planners
// `planners[r]`. kInternal when two ranks write the same item or a tensor
// item's bytes do not match its planned size.
absl::StatusOr<InMemoryCheckpoint> SaveInMemory(
    const std::vector<const StateDict*>& state_dicts,
    const std::vector<SavePlanner*>& planners);

// Loads `checkpoint` into `state_dicts[r]` with `planners[r]`.
absl::Status LoadFromMemory(const InMemoryCheckpoint& checkpoint,
                            const std::vector<StateDict*>& state_dicts,
                            const std::vector<LoadPlanner*>& planners);

// Copies the box `lengths` at `src_offsets` of contiguous `src` (shape
// `src_sizes`) into `dest` at `dest_offsets`, honouring dest's strides.
void CopyBox(const char* src, const Shape& src_sizes, const Shape& src_offsets,
             const TensorView& dest, const Shape& dest_offsets,
             const Shape& lengths);

}  // namespace dcp

#endif  // DCP_PLANNER_IN_MEMORY_CHECKPOINT_H_
