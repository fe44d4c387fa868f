// Compact, versioned binary encodings (protobuf, planner/plan.proto) of what
// the planners exchange between ranks: the flatten mapping carried in
// SavePlan::planner_data, and whole SavePlans and LoadPlans for plan
// exchange. Decoding never trusts its input: any byte string, truncated or
// random, yields a value or kDataLoss, never a crash, and allocation is
// bounded by the input's size.
#ifndef DCP_PLANNER_PLAN_CODEC_H_
#define DCP_PLANNER_PLAN_CODEC_H_

#include <map>
#include <string>

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

}  // namespace dcp

#endif  // DCP_PLANNER_PLAN_CODEC_H_
