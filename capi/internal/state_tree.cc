#include "capi/internal/state_tree.h"

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dcp::capi {
namespace {

using Kind = StateValue::Kind;

ObjectPath Prefix(const ObjectPath& path, size_t length) {
  return ObjectPath(path.begin(), path.begin() + length);
}

// Why `path` cannot step from the value at its first `depth` elements
// (`node`, of kind `kind`) by element `depth`.
absl::Status StepError(const ObjectPath& path, size_t depth, Kind kind) {
  const std::string here = PathToString(Prefix(path, depth));
  const std::string full = PathToString(path);
  if (kind == Kind::kDict) {
    return absl::InvalidArgumentError(absl::StrCat("state dict path \"", full,
                                                   "\" uses the map at \"",
                                                   here, "\" as a list"));
  }
  if (kind == Kind::kList) {
    return absl::InvalidArgumentError(absl::StrCat("state dict path \"", full,
                                                   "\" uses the list at \"",
                                                   here, "\" as a map"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("state dict path \"", full, "\" goes through \"", here,
                   "\", a ", StateKindName(kind), " leaf"));
}

bool IsKey(const PathElement& element) {
  return std::holds_alternative<std::string>(element);
}

// The most entries one call may add to a list past its end: a larger index
// is a mistake (an uninitialised path element), and growing the list to it
// could take all memory.
constexpr uint64_t kMaxListGrowth = uint64_t{1} << 20;

// kInvalidArgument when a list index of `path` lies more than
// kMaxListGrowth past the end of its list (a list the path would create is
// empty). Reads only.
absl::Status CheckListGrowth(const StateDict& root, const ObjectPath& path) {
  const StateValue* node = nullptr;  // nullptr: not there (yet).
  for (size_t depth = 0; depth < path.size(); ++depth) {
    const PathElement& element = path[depth];
    if (depth == 0) {
      auto it = root.find(std::get<std::string>(element));
      node = it == root.end() ? nullptr : &it->second;
      continue;
    }
    if (IsKey(element)) {
      if (node == nullptr || node->kind() != Kind::kDict) {
        node = nullptr;
        continue;
      }
      auto it = node->dict().find(std::get<std::string>(element));
      node = it == node->dict().end() ? nullptr : &it->second;
      continue;
    }
    const uint64_t index = static_cast<uint64_t>(std::get<int64_t>(element));
    const uint64_t size = node != nullptr && node->kind() == Kind::kList
                              ? node->list().size()
                              : 0;
    if (index > size + kMaxListGrowth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state dict path \"", PathToString(path), "\" has list index ", index,
          " at element ", depth, ", more than ", kMaxListGrowth,
          " past the end of its list (", size, " entries)"));
    }
    node = index < size ? &node->list()[index] : nullptr;
  }
  return absl::OkStatus();
}

}  // namespace

std::string PathPrefix(const ObjectPath& path) {
  return absl::StrCat("state dict path \"", PathToString(path), "\"");
}

absl::StatusOr<ObjectPath> PathFromC(const dcp_path_t& path) {
  if (path.len == 0) {
    return absl::InvalidArgumentError("state dict path is empty (len 0)");
  }
  if (path.elems == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state dict path of length ", path.len, " has NULL elems"));
  }
  ObjectPath out;
  out.reserve(path.len);
  for (size_t i = 0; i < path.len; ++i) {
    const dcp_path_elem_t& element = path.elems[i];
    if (element.key != nullptr) {
      out.emplace_back(std::string(element.key));
      continue;
    }
    if (element.index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state dict path \"", PathToString(out), "\" element ", i,
          " is neither a key (key NULL) nor a list index (index ",
          element.index, " < 0)"));
    }
    if (i == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state dict path starts with list index ", element.index,
          "; the root of a state dict is a map, so the first element must "
          "be a key"));
    }
    out.emplace_back(element.index);
  }
  return out;
}

absl::Status SetAtPath(StateDict& root, const ObjectPath& path,
                       StateValue value) {
  // Every container this creates is new and empty, so once one is created
  // no later step can fail: an error leaves the state dict as it was.
  DCP_RETURN_IF_ERROR(CheckListGrowth(root, path));
  StateValue* node = nullptr;  // nullptr: the root map.
  for (size_t depth = 0; depth < path.size(); ++depth) {
    const PathElement& element = path[depth];
    StateValue* child = nullptr;
    if (node == nullptr) {
      child = &root[std::get<std::string>(element)];
    } else if (node->kind() == Kind::kDict) {
      if (!IsKey(element)) return StepError(path, depth, Kind::kDict);
      child = &node->dict()[std::get<std::string>(element)];
    } else {
      if (IsKey(element)) return StepError(path, depth, Kind::kList);
      StateList& list = node->list();
      const int64_t index = std::get<int64_t>(element);
      if (static_cast<uint64_t>(index) >= list.size()) {
        list.resize(static_cast<size_t>(index) + 1);
      }
      child = &list[index];
    }
    if (depth + 1 == path.size()) {
      *child = std::move(value);
      return absl::OkStatus();
    }
    if (child->kind() == Kind::kNone) {
      *child = IsKey(path[depth + 1]) ? StateValue(StateDict{})
                                      : StateValue(StateList{});
    } else if (!child->is_container()) {
      return StepError(path, depth + 1, child->kind());
    }
    node = child;
  }
  return absl::OkStatus();  // Not reached: paths are not empty.
}

absl::StatusOr<StateValue*> FindLeaf(StateDict& root, const ObjectPath& path) {
  const auto not_found = [&path] {
    return absl::NotFoundError(absl::StrCat("state dict has no value at \"",
                                            PathToString(path), "\""));
  };
  StateValue* node = nullptr;  // nullptr: the root map.
  for (size_t depth = 0; depth < path.size(); ++depth) {
    const PathElement& element = path[depth];
    if (node == nullptr || node->kind() == Kind::kDict) {
      if (!IsKey(element)) return StepError(path, depth, Kind::kDict);
      StateDict& map = node == nullptr ? root : node->dict();
      const auto it = map.find(std::get<std::string>(element));
      if (it == map.end()) return not_found();
      node = &it->second;
    } else if (node->kind() == Kind::kList) {
      if (IsKey(element)) return StepError(path, depth, Kind::kList);
      StateList& list = node->list();
      const int64_t index = std::get<int64_t>(element);
      if (static_cast<uint64_t>(index) >= list.size()) return not_found();
      node = &list[index];
    } else if (node->kind() == Kind::kNone) {
      // Nothing there, as a set through a None would make the container.
      return not_found();
    } else {
      return StepError(path, depth, node->kind());
    }
  }
  if (node->is_container()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state dict path \"", PathToString(path), "\" ends at a ",
        node->kind() == Kind::kDict ? "map" : "list", ", not a leaf"));
  }
  return node;
}

}  // namespace dcp::capi
