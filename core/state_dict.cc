#include "core/state_dict.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dcp {

absl::string_view StateKindName(StateValue::Kind kind) {
  switch (kind) {
    case StateValue::Kind::kNone:
      return "none";
    case StateValue::Kind::kTensor:
      return "tensor";
    case StateValue::Kind::kShardedTensor:
      return "sharded tensor";
    case StateValue::Kind::kInt:
      return "int";
    case StateValue::Kind::kDouble:
      return "float";
    case StateValue::Kind::kBool:
      return "bool";
    case StateValue::Kind::kString:
      return "string";
    case StateValue::Kind::kBytes:
      return "bytes";
    case StateValue::Kind::kDict:
      return "dict";
    case StateValue::Kind::kList:
      return "list";
  }
  return "unknown";
}

std::string PathToString(const ObjectPath& path) {
  std::string out;
  bool first = true;
  for (const PathElement& element : path) {
    // A dot between elements, also after an empty key ({"": {"w": ...}} is
    // ".w", as torch names it).
    if (!first) out.push_back('.');
    first = false;
    if (const auto* key = std::get_if<std::string>(&element)) {
      out += *key;
    } else {
      absl::StrAppend(&out, std::get<int64_t>(element));
    }
  }
  return out;
}

namespace {

// Calls `on_leaf(path, leaf)` for every leaf under `value` (a StateValue,
// const or not) in depth-first order; stops at the first error.
template <typename Value, typename OnLeaf>
absl::Status ForEachLeaf(Value& value, ObjectPath& path, OnLeaf& on_leaf) {
  if (value.kind() == StateValue::Kind::kDict) {
    for (auto& [key, child] : value.dict()) {
      path.emplace_back(key);
      absl::Status status = ForEachLeaf(child, path, on_leaf);
      path.pop_back();
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }
  if (value.kind() == StateValue::Kind::kList) {
    auto& list = value.list();
    for (size_t i = 0; i < list.size(); ++i) {
      path.emplace_back(static_cast<int64_t>(i));
      absl::Status status = ForEachLeaf(list[i], path, on_leaf);
      path.pop_back();
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }
  return on_leaf(path, value);
}

template <typename Dict, typename OnLeaf>
absl::Status ForEachLeafOf(Dict& state_dict, OnLeaf on_leaf) {
  ObjectPath path;
  for (auto& [key, value] : state_dict) {
    path.assign(1, key);
    absl::Status status = ForEachLeaf(value, path, on_leaf);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status CollisionError(absl::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat(
      "state dict keys collide after flattening: two values are named \"", name,
      "\"; rename keys that contain dots"));
}

// Returns the child of `node` at `element`, creating containers on the way.
absl::StatusOr<StateValue*> Descend(StateValue& node,
                                    const PathElement& element,
                                    const PathElement* next,
                                    const std::string& name) {
  const bool next_is_index = next && std::holds_alternative<int64_t>(*next);
  StateValue* child = nullptr;
  if (const auto* key = std::get_if<std::string>(&element)) {
    if (node.kind() != StateValue::Kind::kDict) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot unflatten \"", name, "\": key \"", *key,
                       "\" is used under a ", StateKindName(node.kind())));
    }
    child = &node.dict()[*key];
  } else {
    const int64_t index = std::get<int64_t>(element);
    if (node.kind() != StateValue::Kind::kList || index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot unflatten \"", name, "\": index ", index,
                       " is used under a ", StateKindName(node.kind())));
    }
    StateList& list = node.list();
    if (static_cast<size_t>(index) >= list.size()) list.resize(index + 1);
    child = &list[index];
  }
  if (next != nullptr && child->kind() == StateValue::Kind::kNone) {
    *child = next_is_index ? StateValue(StateList{}) : StateValue(StateDict{});
  }
  return child;
}

}  // namespace

absl::StatusOr<FlatStateDict> FlattenStateDict(const StateDict& state_dict) {
  FlatStateDict out;
  absl::Status status = ForEachLeafOf(state_dict, [&](const ObjectPath& path,
                                                      const StateValue& value) {
    std::string name = PathToString(path);
    // Names mostly come in order (dict keys are): appended in O(1).
    const bool last = out.mapping.empty() || out.mapping.rbegin()->first < name;
    if (last) {
      out.mapping.emplace_hint(out.mapping.end(), name, path);
      out.leaves.emplace_hint(out.leaves.end(), std::move(name), value);
      return absl::OkStatus();
    }
    if (!out.mapping.emplace(name, path).second) {
      return CollisionError(name);
    }
    out.leaves.emplace(std::move(name), value);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, StateValue*>>>
FlattenStateDictInPlace(StateDict& state_dict) {
  std::vector<std::pair<std::string, StateValue*>> leaves;
  absl::Status status =
      ForEachLeafOf(state_dict, [&](const ObjectPath& path, StateValue& value) {
        leaves.emplace_back(PathToString(path), &value);
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  std::sort(leaves.begin(), leaves.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < leaves.size(); ++i) {
    if (leaves[i].first == leaves[i - 1].first) {
      return CollisionError(leaves[i].first);
    }
  }
  return leaves;
}

absl::StatusOr<StateDict> UnflattenStateDict(
    std::map<std::string, StateValue> leaves,
    const std::map<std::string, ObjectPath>& mapping) {
  StateValue root{StateDict{}};
  for (auto& [name, value] : leaves) {
    auto it = mapping.find(name);
    ObjectPath fallback{name};
    const ObjectPath& path = it == mapping.end() ? fallback : it->second;
    if (path.empty() || !std::holds_alternative<std::string>(path[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad path for \"", name, "\": must start with a key"));
    }
    StateValue* node = &root;
    for (size_t i = 0; i < path.size(); ++i) {
      const PathElement* next = i + 1 < path.size() ? &path[i + 1] : nullptr;
      absl::StatusOr<StateValue*> child = Descend(*node, path[i], next, name);
      if (!child.ok()) return child.status();
      node = *child;
    }
    *node = std::move(value);
  }
  return std::move(root.dict());
}

StateValue* FindByPath(StateDict& state_dict, const ObjectPath& path) {
  if (path.empty()) return nullptr;
  const auto* first = std::get_if<std::string>(&path[0]);
  if (first == nullptr) return nullptr;
  auto it = state_dict.find(*first);
  if (it == state_dict.end()) return nullptr;
  StateValue* node = &it->second;
  for (size_t i = 1; i < path.size(); ++i) {
    if (const auto* key = std::get_if<std::string>(&path[i])) {
      if (node->kind() != StateValue::Kind::kDict) return nullptr;
      auto child = node->dict().find(*key);
      if (child == node->dict().end()) return nullptr;
      node = &child->second;
    } else {
      const int64_t index = std::get<int64_t>(path[i]);
      if (node->kind() != StateValue::Kind::kList || index < 0 ||
          static_cast<size_t>(index) >= node->list().size()) {
        return nullptr;
      }
      node = &node->list()[index];
    }
  }
  return node;
}

}  // namespace dcp
