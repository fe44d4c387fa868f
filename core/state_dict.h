// StateDict: nested maps and lists whose leaves are tensors, sharded tensors
// or plain values (int, float, bool, string, bytes), and its flattening into
// dotted names ("optim.state.0.exp_avg") with the mapping that restores the
// nesting. The mapping is stored in the checkpoint metadata, so a load
// rebuilds nesting exactly even when keys themselves contain dots.
#ifndef DCP_CORE_STATE_DICT_H_
#define DCP_CORE_STATE_DICT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "core/sharded_tensor.h"
#include "core/tensor.h"

namespace dcp {

// An opaque byte string (the seed's BytesIO values).
struct Bytes {
  std::string data;
  friend bool operator==(const Bytes& a, const Bytes& b) {
    return a.data == b.data;
  }
};

class StateValue;
using StateDict = std::map<std::string, StateValue>;
using StateList = std::vector<StateValue>;

class StateValue {
 public:
  enum class Kind {
    kNone,
    kTensor,
    kShardedTensor,
    kInt,
    kDouble,
    kBool,
    kString,
    kBytes,
    kDict,
    kList,
  };
  // Alternatives in the order of Kind.
  using Variant =
      std::variant<std::monostate, Tensor, ShardedTensor, int64_t, double, bool,
                   std::string, Bytes, StateDict, StateList>;

  StateValue() = default;
  StateValue(Tensor v) : value_(std::move(v)) {}
  StateValue(ShardedTensor v) : value_(std::move(v)) {}
  StateValue(int v) : value_(int64_t{v}) {}
  StateValue(int64_t v) : value_(v) {}
  StateValue(double v) : value_(v) {}
  StateValue(bool v) : value_(v) {}
  StateValue(const char* v) : value_(std::string(v)) {}
  StateValue(std::string v) : value_(std::move(v)) {}
  StateValue(Bytes v) : value_(std::move(v)) {}
  StateValue(StateDict v) : value_(std::move(v)) {}
  StateValue(StateList v) : value_(std::move(v)) {}

  Kind kind() const { return static_cast<Kind>(value_.index()); }
  bool is_tensor() const { return kind() == Kind::kTensor; }
  bool is_sharded_tensor() const { return kind() == Kind::kShardedTensor; }
  bool is_container() const {
    return kind() == Kind::kDict || kind() == Kind::kList;
  }

  // Typed access; the caller checks kind() first.
  const Tensor& tensor() const { return std::get<Tensor>(value_); }
  Tensor& tensor() { return std::get<Tensor>(value_); }
  const ShardedTensor& sharded_tensor() const {
    return std::get<ShardedTensor>(value_);
  }
  ShardedTensor& sharded_tensor() { return std::get<ShardedTensor>(value_); }
  int64_t int_value() const { return std::get<int64_t>(value_); }
  double double_value() const { return std::get<double>(value_); }
  bool bool_value() const { return std::get<bool>(value_); }
  const std::string& string_value() const {
    return std::get<std::string>(value_);
  }
  const Bytes& bytes_value() const { return std::get<Bytes>(value_); }
  const StateDict& dict() const { return std::get<StateDict>(value_); }
  StateDict& dict() { return std::get<StateDict>(value_); }
  const StateList& list() const { return std::get<StateList>(value_); }
  StateList& list() { return std::get<StateList>(value_); }

  const Variant& variant() const { return value_; }

 private:
  Variant value_;
};

// "tensor", "int", ... for messages.
absl::string_view StateKindName(StateValue::Kind kind);

// One step of the path from the root of a StateDict to a value: a map key or
// a list index.
using PathElement = std::variant<std::string, int64_t>;
using ObjectPath = std::vector<PathElement>;

// Leaves by flattened name, plus the path each name came from.
struct FlatStateDict {
  std::map<std::string, StateValue> leaves;
  std::map<std::string, ObjectPath> mapping;
};

// Flattens nested dicts and lists into dotted names ("a.b.0"). Tensors,
// sharded tensors and plain values are leaves; empty containers disappear.
// kInvalidArgument when two paths flatten to the same name (a key containing
// a dot that collides with a nested key).
absl::StatusOr<FlatStateDict> FlattenStateDict(const StateDict& state_dict);

// The same leaves without copying them: (flattened name, leaf) pairs sorted
// by name, pointing into `state_dict` (valid while its containers are left
// as they are; a leaf may be assigned through its pointer). No mapping is
// built. Same errors as FlattenStateDict.
absl::StatusOr<std::vector<std::pair<std::string, StateValue*>>>
FlattenStateDictInPlace(StateDict& state_dict);

// Rebuilds the nesting of `leaves` using `mapping` (names missing from the
// mapping stay top-level keys). kInvalidArgument when two paths disagree on
// the shape (a key used both as a dict and a list).
absl::StatusOr<StateDict> UnflattenStateDict(
    std::map<std::string, StateValue> leaves,
    const std::map<std::string, ObjectPath>& mapping);

// The value at `path`, or nullptr when there is none.
StateValue* FindByPath(StateDict& state_dict, const ObjectPath& path);

// "a.b.0".
std::string PathToString(const ObjectPath& path);

}  // namespace dcp

#endif  // DCP_CORE_STATE_DICT_H_
