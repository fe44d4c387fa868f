// The C ABI's state dicts (dcp_state_dict_*): building one from DLTensors,
// DLPack managed tensors, sharded tensors and plain values, and reading its
// leaves back (as leaf infos and as DLPack).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "capi/internal/dlpack_bridge.h"
#include "capi/internal/dlpack_versioned.h"
#include "capi/internal/handles.h"
#include "capi/internal/last_error.h"
#include "capi/internal/options.h"
#include "capi/internal/registry.h"
#include "capi/internal/state_tree.h"
#include "core/sharded_tensor.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "dcp/dcp.h"

namespace dcp::capi {
namespace {

// Sets `value` at `path` and records whether it is a read-only tensor.
absl::Status SetLeaf(dcp_state_dict& sd, const ObjectPath& path,
                     StateValue value, bool read_only = false) {
  DCP_RETURN_IF_ERROR(SetAtPath(sd.root, path, std::move(value)));
  if (read_only) {
    sd.read_only.insert(path);
  } else {
    sd.read_only.erase(path);
  }
  sd.requires_grad.erase(path);
  sd.Changed();
  return absl::OkStatus();
}

absl::StatusOr<Shape> ShapeFromC(const int64_t* values, int32_t ndim,
                                 const char* what) {
  if (ndim > 0 && values == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is NULL for ndim ", ndim));
  }
  return Shape(values, values + ndim);
}

// The tensor `dl` describes; its memory is kept alive by `owner` (a managed
// tensor) or borrowed (owner empty).
absl::StatusOr<Tensor> TensorFromC(const DLTensor* dl, const ObjectPath& path,
                                   std::shared_ptr<void> owner) {
  if (dl == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(PathPrefix(path), ": the DLTensor is NULL"));
  }
  absl::StatusOr<TensorView> view = ViewOfDLTensor(*dl);
  if (!view.ok()) return Annotate(view.status(), PathPrefix(path));
  if (owner == nullptr) return Tensor::Wrap(*std::move(view));
  return Tensor::WithOwner(*std::move(view), std::move(owner));
}

// A sharded tensor of `chunks` at `offsets` in `global_shape`, checked.
absl::StatusOr<StateValue> ShardedFromC(const ObjectPath& path,
                                        int32_t global_ndim,
                                        const int64_t* global_shape,
                                        std::vector<Tensor> chunks,
                                        const int64_t* const* offsets) {
  if (global_ndim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(PathPrefix(path),
                     ": a sharded tensor needs ndim >= 1 "
                     "(0-d sharded tensors do not exist), "
                     "got ",
                     global_ndim));
  }
  // Every chunk's ndim (known) is checked before global_ndim sizes a read
  // of the caller's global_shape and offsets arrays.
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].sizes().size() != static_cast<size_t>(global_ndim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          PathPrefix(path), ": chunk ", i, " has ndim ",
          chunks[i].sizes().size(), " but the global shape has ", global_ndim));
    }
  }
  DCP_ASSIGN_OR_RETURN(
      Shape global,
      ShapeFromC(global_shape, global_ndim,
                 absl::StrCat(PathPrefix(path), ": global_shape").c_str()));
  std::vector<Shard> shards;
  shards.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (offsets[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(PathPrefix(path), ": offsets of chunk ", i, " is NULL"));
    }
    shards.push_back(Shard{Shape(offsets[i], offsets[i] + global_ndim),
                           std::move(chunks[i])});
  }
  const DType dtype = shards.front().tensor.dtype();
  ShardedTensor sharded(dtype, std::move(global), std::move(shards));
  DCP_RETURN_IF_ERROR(sharded.Validate(PathToString(path)));
  return StateValue(std::move(sharded));
}

// A tensor leaf: plain (shard NULL) or a sharded tensor of one chunk.
absl::StatusOr<StateValue> TensorLeaf(const DLTensor* dl,
                                      const dcp_shard_t* shard,
                                      const ObjectPath& path,
                                      std::shared_ptr<void> owner) {
  DCP_ASSIGN_OR_RETURN(Tensor tensor, TensorFromC(dl, path, std::move(owner)));
  if (shard == nullptr) return StateValue(std::move(tensor));
  std::vector<Tensor> chunks;
  chunks.push_back(std::move(tensor));
  const int64_t* offsets = shard->offsets;
  if (shard->ndim > 0 && offsets == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(PathPrefix(path), ": dcp_shard_t.offsets is NULL"));
  }
  return ShardedFromC(path, shard->ndim, shard->global_shape, std::move(chunks),
                      &offsets);
}

// Owns a managed tensor from the call on: every error path runs its
// deleter once (when the last copy of the owner goes).
std::shared_ptr<void> OwnLegacy(DLManagedTensor* managed) {
  return std::shared_ptr<void>(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
}

std::shared_ptr<void> OwnVersioned(DLManagedTensorVersioned* managed) {
  return std::shared_ptr<void>(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensorVersioned*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
}

absl::Status SetManaged(dcp_state_dict_t* sd, const dcp_path_t& path,
                        const DLTensor& dl, const dcp_shard_t* shard,
                        std::shared_ptr<void> owner, bool read_only) {
  DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
  DCP_ASSIGN_OR_RETURN(ObjectPath p, PathFromC(path));
  DCP_ASSIGN_OR_RETURN(StateValue value,
                       TensorLeaf(&dl, shard, p, std::move(owner)));
  return SetLeaf(*h, p, std::move(value), read_only);
}

absl::Status SetPlain(dcp_state_dict_t* sd, const dcp_path_t& path,
                      StateValue value) {
  DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
  DCP_ASSIGN_OR_RETURN(ObjectPath p, PathFromC(path));
  return SetLeaf(*h, p, std::move(value));
}

absl::StatusOr<std::string> BytesFromC(const void* data, size_t size,
                                       const char* what) {
  if (data == nullptr && size > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " data is NULL with size ", size));
  }
  if (size == 0) return std::string();
  return std::string(static_cast<const char*>(data), size);
}

dcp_leaf_info_t LeafInfo(const StateValue& value) {
  dcp_leaf_info_t info = {};
  switch (value.kind()) {
    case StateValue::Kind::kNone:
      info.kind = DCP_VALUE_NONE;
      break;
    case StateValue::Kind::kTensor: {
      const Tensor& t = value.tensor();
      info.kind = DCP_VALUE_TENSOR;
      info.dtype = static_cast<int32_t>(t.dtype());
      info.ndim = static_cast<int32_t>(t.sizes().size());
      info.shape = t.sizes().data();
      break;
    }
    case StateValue::Kind::kShardedTensor: {
      const ShardedTensor& t = value.sharded_tensor();
      info.kind = DCP_VALUE_SHARDED_TENSOR;
      info.dtype = static_cast<int32_t>(t.dtype());
      info.ndim = static_cast<int32_t>(t.global_sizes().size());
      info.shape = t.global_sizes().data();
      break;
    }
    case StateValue::Kind::kInt:
      info.kind = DCP_VALUE_INT;
      info.int_value = value.int_value();
      break;
    case StateValue::Kind::kDouble:
      info.kind = DCP_VALUE_FLOAT;
      info.float_value = value.double_value();
      break;
    case StateValue::Kind::kBool:
      info.kind = DCP_VALUE_BOOL;
      info.bool_value = value.bool_value() ? 1 : 0;
      break;
    case StateValue::Kind::kString:
      info.kind = DCP_VALUE_STRING;
      info.data = value.string_value().data();
      info.size = value.string_value().size();
      break;
    case StateValue::Kind::kBytes:
      info.kind = DCP_VALUE_BYTES;
      info.data = value.bytes_value().data.data();
      info.size = value.bytes_value().data.size();
      break;
    case StateValue::Kind::kDict:
    case StateValue::Kind::kList:
      break;  // Not leaves: FindLeaf and flattening never return them.
  }
  return info;
}

// The flattened leaves of `sd`, cached until it changes.
absl::StatusOr<const std::vector<std::pair<std::string, StateValue*>>*> Leaves(
    dcp_state_dict& sd) {
  absl::MutexLock lock(&sd.cache_mu);
  if (!sd.leaves.has_value()) {
    DCP_ASSIGN_OR_RETURN(sd.leaves, FlattenStateDictInPlace(sd.root));
  }
  return &*sd.leaves;
}

}  // namespace
}  // namespace dcp::capi

using dcp::capi::CheckOut;
using dcp::capi::Guard;
using dcp::capi::Publish;
using dcp::capi::Resolve;

extern "C" {

int dcp_state_dict_create(dcp_state_dict_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_state_dict_t**"));
    *out = Publish(new dcp_state_dict());
    return absl::OkStatus();
  });
}

int dcp_state_dict_free(dcp_state_dict_t* sd) {
  return dcp::capi::FreeHandle(sd);
}

int dcp_state_dict_set_tensor(dcp_state_dict_t* sd, dcp_path_t path,
                              const DLTensor* tensor,
                              const dcp_shard_t* shard) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(dcp::ObjectPath p, dcp::capi::PathFromC(path));
    DCP_ASSIGN_OR_RETURN(dcp::StateValue value,
                         dcp::capi::TensorLeaf(tensor, shard, p, nullptr));
    return dcp::capi::SetLeaf(*h, p, std::move(value));
  });
}

int dcp_state_dict_set_tensors(dcp_state_dict_t* sd, size_t n,
                               const dcp_path_t* paths, const DLTensor* tensors,
                               const dcp_shard_t* shards) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    if (n > 0 && (paths == nullptr || tensors == nullptr)) {
      return absl::InvalidArgumentError(
          "dcp_state_dict_set_tensors: paths or tensors is NULL");
    }
    for (size_t i = 0; i < n; ++i) {
      DCP_ASSIGN_OR_RETURN(dcp::ObjectPath p, dcp::capi::PathFromC(paths[i]));
      const dcp_shard_t* shard = nullptr;
      if (shards != nullptr) {
        if (shards[i].ndim > 0) {
          shard = &shards[i];
        } else if (shards[i].ndim < 0 || shards[i].global_shape != nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(
              dcp::capi::PathPrefix(p), ": shards[", i, "] has ndim ",
              shards[i].ndim,
              (shards[i].ndim == 0 ? " with a global_shape (0-d sharded "
                                     "tensors do not exist)"
                                   : ""),
              "; use ndim 0 and global_shape NULL for a plain tensor"));
        }
      }
      DCP_ASSIGN_OR_RETURN(
          dcp::StateValue value,
          dcp::capi::TensorLeaf(&tensors[i], shard, p, nullptr));
      DCP_RETURN_IF_ERROR(dcp::capi::SetLeaf(*h, p, std::move(value)));
    }
    return absl::OkStatus();
  });
}

int dcp_state_dict_set_sharded_tensor(dcp_state_dict_t* sd, dcp_path_t path,
                                      int32_t global_ndim,
                                      const int64_t* global_shape,
                                      size_t num_chunks, const DLTensor* chunks,
                                      const int64_t* const* offsets) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(dcp::ObjectPath p, dcp::capi::PathFromC(path));
    if (num_chunks == 0 || chunks == nullptr || offsets == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          dcp::capi::PathPrefix(p),
          ": a sharded tensor needs at least one chunk, with non-NULL "
          "chunks and offsets (num_chunks is ",
          num_chunks, ")"));
    }
    std::vector<dcp::Tensor> tensors;
    tensors.reserve(num_chunks);
    for (size_t i = 0; i < num_chunks; ++i) {
      DCP_ASSIGN_OR_RETURN(dcp::Tensor t,
                           dcp::capi::TensorFromC(&chunks[i], p, nullptr));
      tensors.push_back(std::move(t));
    }
    DCP_ASSIGN_OR_RETURN(dcp::StateValue value,
                         dcp::capi::ShardedFromC(p, global_ndim, global_shape,
                                                 std::move(tensors), offsets));
    return dcp::capi::SetLeaf(*h, p, std::move(value));
  });
}

int dcp_state_dict_set_dlpack(dcp_state_dict_t* sd, dcp_path_t path,
                              DLManagedTensor* tensor,
                              const dcp_shard_t* shard) {
  return Guard([&]() -> absl::Status {
    if (tensor == nullptr) {
      return absl::InvalidArgumentError("the DLManagedTensor is NULL");
    }
    std::shared_ptr<void> owner = dcp::capi::OwnLegacy(tensor);
    return dcp::capi::SetManaged(sd, path, tensor->dl_tensor, shard,
                                 std::move(owner), /*read_only=*/false);
  });
}

int dcp_state_dict_set_dlpack_versioned(dcp_state_dict_t* sd, dcp_path_t path,
                                        DLManagedTensorVersioned* tensor,
                                        const dcp_shard_t* shard) {
  return Guard([&]() -> absl::Status {
    if (tensor == nullptr) {
      return absl::InvalidArgumentError("the DLManagedTensorVersioned is NULL");
    }
    std::shared_ptr<void> owner = dcp::capi::OwnVersioned(tensor);
    if (tensor->version.major != dcp::capi::kDLPackMajorVersion) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DLManagedTensorVersioned has DLPack version ", tensor->version.major,
          ".", tensor->version.minor,
          "; this library reads DLPack 1.x (its deleter was called)"));
    }
    return dcp::capi::SetManaged(
        sd, path, tensor->dl_tensor, shard, std::move(owner),
        (tensor->flags & dcp::capi::kDLPackFlagReadOnly) != 0);
  });
}

int dcp_state_dict_mark_requires_grad(dcp_state_dict_t* sd, size_t n,
                                      const dcp_path_t* paths) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    if (n > 0 && paths == nullptr) {
      return absl::InvalidArgumentError(
          "dcp_state_dict_mark_requires_grad: paths is NULL");
    }
    for (size_t i = 0; i < n; ++i) {
      DCP_ASSIGN_OR_RETURN(dcp::ObjectPath p, dcp::capi::PathFromC(paths[i]));
      DCP_ASSIGN_OR_RETURN(dcp::StateValue * leaf,
                           dcp::capi::FindLeaf(h->root, p));
      if (!leaf->is_tensor() && !leaf->is_sharded_tensor()) {
        return absl::InvalidArgumentError(
            absl::StrCat(dcp::capi::PathPrefix(p), ": holds a ",
                         dcp::StateKindName(leaf->kind()),
                         ", not a tensor; only tensors require grad"));
      }
      h->requires_grad.insert(std::move(p));
    }
    return absl::OkStatus();
  });
}

int dcp_state_dict_set_none(dcp_state_dict_t* sd, dcp_path_t path) {
  return Guard([&] { return dcp::capi::SetPlain(sd, path, {}); });
}

int dcp_state_dict_set_int(dcp_state_dict_t* sd, dcp_path_t path,
                           int64_t value) {
  return Guard(
      [&] { return dcp::capi::SetPlain(sd, path, dcp::StateValue(value)); });
}

int dcp_state_dict_set_float(dcp_state_dict_t* sd, dcp_path_t path,
                             double value) {
  return Guard(
      [&] { return dcp::capi::SetPlain(sd, path, dcp::StateValue(value)); });
}

int dcp_state_dict_set_bool(dcp_state_dict_t* sd, dcp_path_t path,
                            int32_t value) {
  return Guard([&] {
    return dcp::capi::SetPlain(sd, path, dcp::StateValue(value != 0));
  });
}

int dcp_state_dict_set_string(dcp_state_dict_t* sd, dcp_path_t path,
                              const char* data, size_t size) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(std::string s,
                         dcp::capi::BytesFromC(data, size, "string"));
    return dcp::capi::SetPlain(sd, path, dcp::StateValue(std::move(s)));
  });
}

int dcp_state_dict_set_bytes(dcp_state_dict_t* sd, dcp_path_t path,
                             const void* data, size_t size) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(std::string s,
                         dcp::capi::BytesFromC(data, size, "bytes"));
    return dcp::capi::SetPlain(sd, path,
                               dcp::StateValue(dcp::Bytes{std::move(s)}));
  });
}

int dcp_state_dict_get(const dcp_state_dict_t* sd, dcp_path_t path,
                       dcp_leaf_info_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(dcp::capi::CheckOutStruct(out, "dcp_leaf_info_t"));
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(dcp::ObjectPath p, dcp::capi::PathFromC(path));
    DCP_ASSIGN_OR_RETURN(dcp::StateValue * leaf,
                         dcp::capi::FindLeaf(h->root, p));
    dcp::capi::WriteVersioned(dcp::capi::LeafInfo(*leaf), out);
    return absl::OkStatus();
  });
}

int dcp_state_dict_num_leaves(const dcp_state_dict_t* sd, size_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "size_t*"));
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(const auto* leaves, dcp::capi::Leaves(*h));
    *out = leaves->size();
    return absl::OkStatus();
  });
}

int dcp_state_dict_leaf(const dcp_state_dict_t* sd, size_t index,
                        const char** name, dcp_leaf_info_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(name, "name"));
    DCP_RETURN_IF_ERROR(dcp::capi::CheckOutStruct(out, "dcp_leaf_info_t"));
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(const auto* leaves, dcp::capi::Leaves(*h));
    if (index >= leaves->size()) {
      return absl::OutOfRangeError(absl::StrCat("leaf index ", index,
                                                " is out of range; the state "
                                                "dict has ",
                                                leaves->size(), " leaves"));
    }
    *name = (*leaves)[index].first.c_str();
    dcp::capi::WriteVersioned(dcp::capi::LeafInfo(*(*leaves)[index].second),
                              out);
    return absl::OkStatus();
  });
}

int dcp_state_dict_dtype_mismatches(const dcp_state_dict_t* sd,
                                    const dcp_metadata_t* md, size_t capacity,
                                    size_t* indices, int32_t* saved_dtypes,
                                    size_t* count) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(count, "size_t* count"));
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * m, Resolve(md));
    DCP_ASSIGN_OR_RETURN(const auto* leaves, dcp::capi::Leaves(*h));
    // Both are in flattened-name order: one merge walk.
    size_t found = 0;
    auto item = m->items.begin();
    for (size_t i = 0; i < leaves->size(); ++i) {
      const auto& [name, value] = (*leaves)[i];
      if (!value->is_tensor() && !value->is_sharded_tensor()) continue;
      while (item != m->items.end() && *item->name < name) ++item;
      if (item == m->items.end()) break;
      if (*item->name != name || item->tensor == nullptr) continue;
      const int32_t saved =
          static_cast<int32_t>(item->tensor->properties.dtype);
      if (dcp::capi::LeafInfo(*value).dtype == saved) continue;
      if (found < capacity) {
        if (indices != nullptr) indices[found] = i;
        if (saved_dtypes != nullptr) saved_dtypes[found] = saved;
      }
      ++found;
    }
    *count = found;
    return absl::OkStatus();
  });
}

int dcp_state_dict_get_dlpack(const dcp_state_dict_t* sd, dcp_path_t path,
                              DLManagedTensor** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "DLManagedTensor**"));
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(dcp::ObjectPath p, dcp::capi::PathFromC(path));
    DCP_ASSIGN_OR_RETURN(dcp::StateValue * leaf,
                         dcp::capi::FindLeaf(h->root, p));
    if (!leaf->is_tensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dcp::capi::PathPrefix(p), " holds a ",
                       dcp::StateKindName(leaf->kind()),
                       ", not a tensor; only tensor leaves export as DLPack"));
    }
    // A legacy DLManagedTensor has no read-only flag: exporting would hand
    // out a writable alias of memory its producer marked read-only.
    if (h->read_only.count(p) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          dcp::capi::PathPrefix(p),
          " is read-only (set with DLPACK_FLAG_BITMASK_READ_ONLY); a "
          "DLManagedTensor cannot carry that flag, so it is not exported"));
    }
    DCP_ASSIGN_OR_RETURN(*out, dcp::capi::ExportDLPack(leaf->tensor()));
    return absl::OkStatus();
  });
}

}  // extern "C"
