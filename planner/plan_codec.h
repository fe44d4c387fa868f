// Compact, versioned binary encodings (protobuf, planner/plan.proto) of what
// the planners exchange between ranks: the flatten mapping carried in
// SavePlan::planner_data, and whole SavePlans and LoadPlans for plan
// exchange. Decoding never trusts its input: any byte string, truncated or
// random, yields a value or kDataLoss, never a crash, and allocation is
// bounded by the input's size.
#ifndef DCP_PLANNER_PLAN_CODEC_H_
#define DCP_PLANNER_PLAN_CODEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/state_dict.h"
#include "planner/plan.h"

namespace dcp {

// The encoding version written by this build; decoders accept versions up to
// and including it.
inline constexpr uint32_t kPlanEncodingVersion = 1;

using FlattenMapping = std::map<std::string, ObjectPath>;

// A path equal to its name split on '.' is stored as a bit mask of which
// segments are list indices (a few bytes); other paths are stored in full.
std::string EncodeFlattenMapping(const FlattenMapping& mapping);
absl::StatusOr<FlattenMapping> DecodeFlattenMapping(absl::string_view bytes);

// A 128-bit digest of a plan (XXH3-128), used as a plan cache key.
struct PlanDigest {
  uint64_t high = 0;
  uint64_t low = 0;
  friend bool operator==(const PlanDigest& a, const PlanDigest& b) {
    return a.high == b.high && a.low == b.low;
  }
  friend bool operator!=(const PlanDigest& a, const PlanDigest& b) {
    return !(a == b);
  }
  template <typename H>
  friend H AbslHashValue(H h, const PlanDigest& d) {
    return H::combine(std::move(h), d.high, d.low);
  }
};

// What DefaultSavePlanner keeps in SavePlan::planner_data: the flatten
// mapping, and with plan caching the plan's digest and whether the plan is an
// "unchanged" marker standing for a cached plan.
//
// The mapping travels compactly: `list_masks` holds, for each run of equal
// consecutive item names in the plan, the DerivedPath list mask of that
// name's path, or kExplicitPath when the path is in `mapping`;
// `joined_masks` is empty (no path keeps a dot inside a key) or holds the
// DerivedPath joined mask of each run; `mapping` holds only the explicit
// paths and the leaves that have no items. (With `list_masks` empty,
// `mapping` is the whole mapping.)
struct SavePlannerData {
  std::optional<PlanDigest> digest;
  bool unchanged = false;
  FlattenMapping mapping;
  std::vector<uint64_t> list_masks;
  std::vector<uint64_t> joined_masks;
  // Sharded tensors of which the rank holds only empty shards of a
  // non-empty global shape (so no items): name and global shape, by name.
  std::vector<std::pair<std::string, Shape>> unheld;
};

// Never a derived mask: the root of a path is always a key (bit 0 clear).
inline constexpr uint64_t kExplicitPath = ~uint64_t{0};

// A path that joins back into its name with '.': `list` has bit i set where
// segment i is a list index; `joined` has bit j set where the name's j-th dot
// lies inside a key rather than between two segments ({"model",
// "layers.0.weight"} of "model.layers.0.weight" is list 0, joined 0b110).
struct DerivedPath {
  uint64_t list = 0;
  uint64_t joined = 0;
};

// The DerivedPath of `path` when its elements joined by '.' spell `name`
// (keys as they are, list indices in decimal, the first element a key), it
// has at most 64 elements, and no dot inside a key is past the name's 64th;
// nullopt otherwise (the path is then stored in full).
std::optional<DerivedPath> DerivePath(absl::string_view name,
                                      const ObjectPath& path);

// DerivePath's list mask when `path` is `name` split on every '.'.
std::optional<uint64_t> DerivedListMask(absl::string_view name,
                                        const ObjectPath& path);

// The inverse of DerivePath: `name` split on the dots not in `joined`, list
// indices where `list` says. kDataLoss when the masks do not fit the name.
absl::StatusOr<ObjectPath> PathFromListMask(absl::string_view name,
                                            uint64_t list, uint64_t joined = 0);

// Fills data->list_masks, data->joined_masks and data->mapping from the full
// `mapping` of a plan's leaves, as described above. Linear when the items
// are in name order (as DefaultSavePlanner plans them).
void SetCompactMapping(const std::vector<WriteItem>& items,
                       const FlattenMapping& mapping, SavePlannerData* data);

std::string EncodeSavePlannerData(const SavePlannerData& data);
absl::StatusOr<SavePlannerData> DecodeSavePlannerData(absl::string_view bytes);

// Whole plans, for exchange between ranks. Names and tensor
// properties are stored once per message. Decoding checks every reference
// and count; it allocates at most a constant factor more than the input
// (names referenced by many items are copied at most kMaxNameExpansion times
// the input size, else kDataLoss).
inline constexpr size_t kMaxNameExpansion = 256;

std::string EncodeSavePlan(const SavePlan& plan);
absl::StatusOr<SavePlan> DecodeSavePlan(absl::string_view bytes);

std::string EncodeLoadPlan(const LoadPlan& plan);
absl::StatusOr<LoadPlan> DecodeLoadPlan(absl::string_view bytes);

}  // namespace dcp

#endif  // DCP_PLANNER_PLAN_CODEC_H_
