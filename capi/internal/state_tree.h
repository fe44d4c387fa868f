// Paths into a StateDict for the C ABI: converting dcp_path_t, and setting
// and finding leaves by path with the rules of dcp/dcp.h (maps and lists
// are created on the way, lists grow to fit an index, a path may not go
// through a leaf or use a map as a list or a list as a map).
//
// Thread safety: the functions touch only their arguments.
#ifndef DCP_CAPI_INTERNAL_STATE_TREE_H_
#define DCP_CAPI_INTERNAL_STATE_TREE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/state_dict.h"
#include "dcp/dcp.h"

namespace dcp::capi {

// "state dict path \"a.b\"", the start of messages about `path`.
std::string PathPrefix(const ObjectPath& path);

// The path as an ObjectPath. kInvalidArgument for an empty path, NULL
// elems, a negative list index, or a first element that is not a key (the
// root of a state dict is a map).
absl::StatusOr<ObjectPath> PathFromC(const dcp_path_t& path);

// Puts `value` at `path`, replacing what was there and creating the maps
// and lists on the way (unset list elements are None; a None value on the
// way is replaced by the container the path needs). kInvalidArgument
// naming the path when it goes through a leaf, uses a map as a list or a
// list as a map; nothing is changed then.
absl::Status SetAtPath(StateDict& root, const ObjectPath& path,
                       StateValue value);

// The leaf at `path`. kNotFound naming the path when nothing is there (a
// None on the way included, as SetAtPath would make a container there);
// kInvalidArgument when the path ends at a map or list, goes through
// another leaf, or uses a map as a list or a list as a map.
absl::StatusOr<StateValue*> FindLeaf(StateDict& root, const ObjectPath& path);

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_STATE_TREE_H_
