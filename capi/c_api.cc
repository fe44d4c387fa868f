// The C ABI of dcp (dcp/dcp.h) over the C++ engine. Every entry point runs
// its body in Guard (capi/internal/last_error.h): handles are checked
// against the registry, failures become the thread's last error, and no
// exception leaves the library.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "capi/internal/async_uploads.h"
#include "capi/internal/dlpack_bridge.h"
#include "capi/internal/dlpack_versioned.h"
#include "capi/internal/handles.h"
#include "capi/internal/last_error.h"
#include "capi/internal/options.h"
#include "capi/internal/ordered_reader.h"
#include "capi/internal/registry.h"
#include "capi/internal/state_tree.h"
#include "capi/internal/store_adapter.h"
#include "comm/process_group_factory.h"
#include "core/dtype.h"
#include "core/sharded_tensor.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "dcp/dcp.h"
#include "engine/async_save.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "io/hf_quantized_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"
#include "io/storage_registry.h"
#include "planner/default_planner.h"

namespace dcp::capi {
namespace {

static_assert(static_cast<int>(DType::kC128) == DCP_DTYPE_C128 &&
                  static_cast<int>(DType::kF8E4M3) == DCP_DTYPE_F8_E4M3 &&
                  kNumDTypes == DCP_DTYPE_C128 + 1,
              "dcp_dtype_t must number dtypes as core/dtype.h does");
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
                  DCP_UNAUTHENTICATED,
              "dcp_status_t must number codes as absl::StatusCode does");

#define DCP_CAPI_STR_(x) #x
#define DCP_CAPI_STR(x) DCP_CAPI_STR_(x)
constexpr char kVersion[] = DCP_CAPI_STR(DCP_VERSION_MAJOR) "." DCP_CAPI_STR(
    DCP_VERSION_MINOR) "." DCP_CAPI_STR(DCP_VERSION_PATCH);

template <typename T>
absl::Status CheckOut(T* out, const char* what) {
  if (out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the output pointer ", what, " is NULL"));
  }
  return absl::OkStatus();
}

// dcp_*_free: NULL is a no-op; a live handle is forgotten, then deleted.
template <typename H>
int FreeHandle(H* handle) {
  return Guard([&]() -> absl::Status {
    if (handle == nullptr) return absl::OkStatus();
    DCP_RETURN_IF_ERROR(UnregisterHandle(handle, H::kType));
    delete handle;
    return absl::OkStatus();
  });
}

// A new group handle for `group` in *out.
absl::Status PublishGroup(
    absl::StatusOr<std::unique_ptr<comm::ProcessGroup>> group,
    dcp_process_group_t** out) {
  if (!group.ok()) return group.status();
  auto handle = std::make_unique<dcp_process_group>();
  handle->group = *std::move(group);
  *out = Publish(handle.release());
  return absl::OkStatus();
}

// A new storage handle in *out (a dcp_storage_writer or _reader) holding a
// `Storage` made from `path` and the converted `options`; `function` names
// the C call in errors.
template <typename Storage, typename Options, typename Handle>
absl::Status CreateStorage(const char* function, const char* path,
                           absl::StatusOr<Options> options, Handle** out) {
  constexpr bool kWriter = std::is_same_v<Handle, dcp_storage_writer>;
  DCP_RETURN_IF_ERROR(CheckOut(
      out, kWriter ? "dcp_storage_writer_t**" : "dcp_storage_reader_t**"));
  if (path == nullptr || path[0] == '\0') {
    return absl::InvalidArgumentError(
        absl::StrCat(function, ": the path is NULL or empty"));
  }
  if (!options.ok()) return options.status();
  auto handle = std::make_unique<Handle>();
  if constexpr (kWriter) {
    handle->writer = std::make_shared<Storage>(path, *std::move(options));
  } else {
    // The reader's device staging is the handle's, so a load can order its
    // copies (OrderedReader). Its defaults are the readers' own.
    handle->staging = std::make_shared<DeviceStaging>();
    if constexpr (requires { options->base.device_staging; }) {
      options->base.device_staging = handle->staging.get();  // wrapped reader
    } else {
      options->device_staging = handle->staging.get();
    }
    handle->reader = std::make_shared<Storage>(path, *std::move(options));
  }
  *out = Publish(handle.release());
  return absl::OkStatus();
}

std::string PathPrefix(const ObjectPath& path) {
  return absl::StrCat("state dict path \"", PathToString(path), "\"");
}

// ---------------------------------------------------------------------------
// Process groups in use.

// Guards dcp_process_group::users and default_group: a group is pinned
// while a save or load uses it, and cannot be freed then.
ABSL_CONST_INIT absl::Mutex group_mu(absl::kConstInit);
dcp_process_group* default_group ABSL_GUARDED_BY(group_mu) = nullptr;

// The group a save or load uses, pinned for the pin's life.
class GroupPin {
 public:
  GroupPin() = default;
  explicit GroupPin(dcp_process_group* group) : group_(group) {}
  GroupPin(GroupPin&& other) : group_(std::exchange(other.group_, nullptr)) {}
  GroupPin& operator=(GroupPin&& other) {
    if (this != &other) {
      Release();
      group_ = std::exchange(other.group_, nullptr);
    }
    return *this;
  }
  ~GroupPin() { Release(); }

  // nullptr: single-process.
  comm::ProcessGroup* get() const {
    return group_ == nullptr ? nullptr : group_->group.get();
  }

 private:
  void Release() {
    if (group_ == nullptr) return;
    absl::MutexLock lock(&group_mu);
    --group_->users;
    group_ = nullptr;
  }

  dcp_process_group* group_ = nullptr;
};

// The group a call uses: `requested`, else the default one, none with
// no_dist.
absl::StatusOr<GroupPin> PinGroup(dcp_process_group_t* requested,
                                  bool no_dist) {
  if (no_dist) return GroupPin();
  absl::MutexLock lock(&group_mu);
  dcp_process_group* group = default_group;
  if (requested != nullptr) {
    DCP_ASSIGN_OR_RETURN(group, Resolve(requested));
  }
  if (group == nullptr) return GroupPin();
  ++group->users;
  return GroupPin(group);
}

// ---------------------------------------------------------------------------
// State dict leaves.

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
  DCP_ASSIGN_OR_RETURN(Shape global,
                       ShapeFromC(global_shape, global_ndim, "global_shape"));
  std::vector<Shard> shards;
  shards.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].sizes().size() != static_cast<size_t>(global_ndim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          PathPrefix(path), ": chunk ", i, " has ndim ",
          chunks[i].sizes().size(), " but the global shape has ", global_ndim));
    }
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

// kInvalidArgument naming the first read-only tensor a load would write.
absl::Status CheckWritable(dcp_state_dict& sd) {
  for (const ObjectPath& path : sd.read_only) {
    absl::StatusOr<StateValue*> leaf = FindLeaf(sd.root, path);
    if (leaf.ok() && ((*leaf)->is_tensor() || (*leaf)->is_sharded_tensor())) {
      return absl::InvalidArgumentError(absl::StrCat(
          PathPrefix(path),
          ": the tensor is read-only (its DLManagedTensorVersioned has "
          "DLPACK_FLAG_BITMASK_READ_ONLY); a load cannot write into it"));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Save and load options.

// Everything a save needs that the C caller did not hand in: the engine's
// options point into it, so it lives until the save ends (for an async
// save, until its upload is done).
struct SaveJob {
  SaveOptions options;
  std::shared_ptr<DefaultStager> stager;  // dcp_save_options_t.async_stager
  std::unique_ptr<ExitGatedWriter> writer;
  std::unique_ptr<DefaultSavePlanner> planner;
  GroupPin group;
};

// The flattened names of the tensors `sd` marks with requires_grad (marks
// whose path no longer holds a tensor are dropped).
std::set<std::string> RequiresGradNames(dcp_state_dict& sd) {
  std::set<std::string> names;
  for (const ObjectPath& path : sd.requires_grad) {
    absl::StatusOr<StateValue*> leaf = FindLeaf(sd.root, path);
    if (leaf.ok() && ((*leaf)->is_tensor() || (*leaf)->is_sharded_tensor())) {
      names.insert(PathToString(path));
    }
  }
  return names;
}

absl::StatusOr<std::unique_ptr<SaveJob>> PrepareSave(
    dcp_state_dict& sd, const dcp_save_options_t* c_options, bool async) {
  DCP_ASSIGN_OR_RETURN(dcp_save_options_t in,
                       ReadVersioned(c_options, "dcp_save_options_t"));
  auto job = std::make_unique<SaveJob>();
  SaveOptions& options = job->options;
  const std::string checkpoint_id =
      in.checkpoint_id == nullptr ? "" : in.checkpoint_id;
  if (async) {
    if (in.async_checkpointer_type == DCP_ASYNC_PROCESS) {
      return absl::UnimplementedError(
          "dcp_save_options_t.async_checkpointer_type DCP_ASYNC_PROCESS is "
          "not in this library; use DCP_ASYNC_THREAD");
    }
    if (in.async_checkpointer_type != DCP_ASYNC_THREAD) {
      return absl::InvalidArgumentError(
          absl::StrCat("dcp_save_options_t.async_checkpointer_type is ",
                       in.async_checkpointer_type,
                       "; use DCP_ASYNC_THREAD (0) or DCP_ASYNC_PROCESS (1)"));
    }
    if (in.async_stager != nullptr) {
      DCP_ASSIGN_OR_RETURN(dcp_stager * stager, Resolve(in.async_stager));
      job->stager = stager->stager;
    }
  } else if (in.async_stager != nullptr) {
    return absl::InvalidArgumentError(
        "dcp_save_options_t.async_stager is for dcp_async_save; dcp_save "
        "writes from the tensors' own memory");
  }
  if (in.storage_writer != nullptr) {
    DCP_ASSIGN_OR_RETURN(dcp_storage_writer * writer,
                         Resolve(in.storage_writer));
    job->writer =
        std::make_unique<ExitGatedWriter>(writer->writer, checkpoint_id);
  } else {
    if (checkpoint_id.empty()) {
      return absl::InvalidArgumentError(
          "a save needs dcp_save_options_t.checkpoint_id (a directory) or "
          "storage_writer");
    }
    // The storage the id names (io/storage_registry.h): native for a
    // path, MEGA for mega://DIR.
    DCP_ASSIGN_OR_RETURN(
        std::unique_ptr<StorageWriter> writer,
        StorageRegistry::Default().CreateWriter(checkpoint_id));
    job->writer = std::make_unique<ExitGatedWriter>(
        std::shared_ptr<StorageWriter>(std::move(writer)), "");
  }
  options.checkpoint_id = checkpoint_id;
  options.storage_writer = job->writer.get();
  DCP_ASSIGN_OR_RETURN(
      bool no_dist, ReadFlag(in.no_dist, false, "dcp_save_options_t.no_dist"));
  DCP_ASSIGN_OR_RETURN(
      options.use_collectives,
      ReadFlag(in.use_collectives, true, "dcp_save_options_t.use_collectives"));
  DCP_ASSIGN_OR_RETURN(options.device_wait, DeviceWaitFromC(in.device_wait));
  options.coordinator_rank = in.coordinator_rank;
  DCP_ASSIGN_OR_RETURN(job->group, PinGroup(in.process_group, no_dist));
  options.process_group = job->group.get();
  // The C ABI's default group decides; none means single-process.
  options.no_dist = options.process_group == nullptr;
  const int ranks =
      options.process_group == nullptr ? 1 : options.process_group->size();
  // As the engine's own default planner: a rank-local save (no
  // collectives) holds only this rank's shards.
  DCP_ASSIGN_OR_RETURN(DefaultSavePlannerOptions planner_options,
                       SavePlannerOptionsFromC(
                           in.planner, options.use_collectives || ranks == 1));
  planner_options.requires_grad = RequiresGradNames(sd);
  job->planner = std::make_unique<DefaultSavePlanner>(planner_options);
  options.planner = job->planner.get();
  return job;
}

// ---------------------------------------------------------------------------
// Metadata.

absl::StatusOr<const MetadataItem*> ItemAt(const dcp_metadata& md,
                                           size_t index) {
  if (index >= md.items.size()) {
    return absl::OutOfRangeError(absl::StrCat("metadata item index ", index,
                                              " is out of range; there are ",
                                              md.items.size(), " items"));
  }
  return &md.items[index];
}

// ---------------------------------------------------------------------------
// Async saves.

template <typename T>
absl::Status ResultStatus(const absl::StatusOr<T>& result) {
  return result.status();
}
absl::Status ResultStatus(const absl::Status& result) { return result; }

absl::Status CheckCompletion(int32_t which) {
  if (which == DCP_STAGING || which == DCP_UPLOAD) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "completion ", which, " is neither DCP_STAGING (0) nor DCP_UPLOAD (1)"));
}

// Waits up to `timeout_ms` (0: poll, < 0: forever) for `future`.
template <typename T>
absl::Status WaitFor(const Future<T>& future, int64_t timeout_ms,
                     int32_t* done) {
  bool ready;
  if (timeout_ms == 0) {
    ready = future.ready();
  } else if (timeout_ms < 0) {
    future.Wait();
    ready = true;
  } else {
    ready = future.WaitFor(absl::Milliseconds(timeout_ms));
  }
  *done = ready ? 1 : 0;
  if (!ready) return absl::OkStatus();
  return ResultStatus(future.Wait());
}

template <typename T>
void CallWhenDone(const Future<T>& future, void (*callback)(void*, int),
                  void* user) {
  future.OnReady([callback, user](const auto& result) {
    if (Exiting()) return;  // The caller's code may be gone.
    CallbackScope scope;
    callback(user, static_cast<int>(ResultStatus(result).code()));
  });
}

}  // namespace
}  // namespace dcp::capi

using dcp::capi::CheckOut;
using dcp::capi::Guard;
using dcp::capi::Publish;
using dcp::capi::Resolve;

extern "C" {

// ---------------------------------------------------------------------------
// Version, status codes, the last error.

const char* dcp_version(void) { return dcp::capi::kVersion; }

const char* dcp_status_name(int code) {
  static constexpr const char* kNames[] = {
      "OK",
      "CANCELLED",
      "UNKNOWN",
      "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED",
      "NOT_FOUND",
      "ALREADY_EXISTS",
      "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION",
      "ABORTED",
      "OUT_OF_RANGE",
      "UNIMPLEMENTED",
      "INTERNAL",
      "UNAVAILABLE",
      "DATA_LOSS",
      "UNAUTHENTICATED",
  };
  if (code < 0 || code >= static_cast<int>(std::size(kNames))) {
    return "UNKNOWN_CODE";
  }
  return kNames[code];
}

int dcp_last_error_code(void) { return dcp::capi::LastErrorCode(); }

const char* dcp_last_error_message(void) {
  return dcp::capi::LastErrorMessage();
}

size_t dcp_last_error_num_rank_failures(void) {
  return dcp::capi::LastErrorNumRankFailures();
}

int dcp_last_error_rank_failure(size_t index, int32_t* rank, int* code,
                                const char** message) {
  // Reading the last error never replaces it, so these errors are returned
  // without being recorded.
  if (rank == nullptr || code == nullptr || message == nullptr) {
    return DCP_INVALID_ARGUMENT;
  }
  if (!dcp::capi::LastErrorRankFailure(index, *rank, *code, *message)) {
    return DCP_OUT_OF_RANGE;
  }
  return DCP_OK;
}

const char* dcp_dtype_name(int dtype) {
  if (dtype < 0 || dtype >= dcp::kNumDTypes) return nullptr;
  // DTypeName views a string literal, so it is NUL-terminated.
  return dcp::DTypeName(static_cast<dcp::DType>(dtype)).data();
}

// ---------------------------------------------------------------------------
// State dicts.

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
    DCP_ASSIGN_OR_RETURN(*out, dcp::capi::ExportDLPack(leaf->tensor()));
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------
// Storage.

int dcp_fs_writer_create(const char* path,
                         const dcp_fs_writer_options_t* options,
                         dcp_storage_writer_t** out) {
  return Guard([&]() -> absl::Status {
    return dcp::capi::CreateStorage<dcp::FileSystemWriter>(
        "dcp_fs_writer_create", path, dcp::capi::WriterOptionsFromC(options),
        out);
  });
}

int dcp_storage_writer_free(dcp_storage_writer_t* writer) {
  // Async saves still uploading keep the writer itself.
  return dcp::capi::FreeHandle(writer);
}

int dcp_fs_reader_create(const char* path,
                         const dcp_fs_reader_options_t* options,
                         dcp_storage_reader_t** out) {
  return Guard([&]() -> absl::Status {
    return dcp::capi::CreateStorage<dcp::FileSystemReader>(
        "dcp_fs_reader_create", path, dcp::capi::ReaderOptionsFromC(options),
        out);
  });
}

int dcp_storage_reader_free(dcp_storage_reader_t* reader) {
  return dcp::capi::FreeHandle(reader);
}

int dcp_hf_writer_create(const char* path,
                         const dcp_hf_writer_options_t* options,
                         dcp_storage_writer_t** out) {
  return Guard([&]() -> absl::Status {
    return dcp::capi::CreateStorage<dcp::HuggingFaceStorageWriter>(
        "dcp_hf_writer_create", path, dcp::capi::HfWriterOptionsFromC(options),
        out);
  });
}

int dcp_hf_reader_create(const char* path,
                         const dcp_hf_reader_options_t* options,
                         dcp_storage_reader_t** out) {
  return Guard([&]() -> absl::Status {
    return dcp::capi::CreateStorage<dcp::HuggingFaceStorageReader>(
        "dcp_hf_reader_create", path, dcp::capi::HfReaderOptionsFromC(options),
        out);
  });
}

int dcp_hf_quantized_reader_create(
    const char* path, const dcp_hf_quantized_reader_options_t* options,
    dcp_storage_reader_t** out) {
  return Guard([&]() -> absl::Status {
    return dcp::capi::CreateStorage<dcp::QuantizedHuggingFaceStorageReader>(
        "dcp_hf_quantized_reader_create", path,
        dcp::capi::HfQuantizedReaderOptionsFromC(options), out);
  });
}

int dcp_mega_writer_create(const char* path,
                           const dcp_mega_writer_options_t* options,
                           dcp_storage_writer_t** out) {
  return Guard([&]() -> absl::Status {
    return dcp::capi::CreateStorage<dcp::MegaStorageWriter>(
        "dcp_mega_writer_create", path,
        dcp::capi::MegaWriterOptionsFromC(options), out);
  });
}

int dcp_mega_reader_create(const char* path,
                           const dcp_mega_reader_options_t* options,
                           dcp_storage_reader_t** out) {
  return Guard([&]() -> absl::Status {
    return dcp::capi::CreateStorage<dcp::MegaStorageReader>(
        "dcp_mega_reader_create", path,
        dcp::capi::MegaReaderOptionsFromC(options), out);
  });
}

// ---------------------------------------------------------------------------
// Process groups.

int dcp_process_group_create_from_env(
    const dcp_process_group_options_t* options, dcp_process_group_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_process_group_t**"));
    DCP_ASSIGN_OR_RETURN(dcp::comm::ProcessGroupOptions group_options,
                         dcp::capi::ProcessGroupOptionsFromC(options));
    return dcp::capi::PublishGroup(
        dcp::comm::CreateProcessGroupFromEnvironment(group_options), out);
  });
}

int dcp_process_group_create_from_store(
    const dcp_store_t* store, int32_t rank, int32_t size,
    const dcp_process_group_options_t* options, dcp_process_group_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_process_group_t**"));
    return dcp::capi::PublishGroup(
        dcp::capi::CreateGroupOverStore(store, rank, size, options), out);
  });
}

int dcp_process_group_rank(const dcp_process_group_t* group, int32_t* rank) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(rank, "int32_t* rank"));
    DCP_ASSIGN_OR_RETURN(dcp_process_group * h, Resolve(group));
    *rank = h->group->rank();
    return absl::OkStatus();
  });
}

int dcp_process_group_size(const dcp_process_group_t* group, int32_t* size) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(size, "int32_t* size"));
    DCP_ASSIGN_OR_RETURN(dcp_process_group * h, Resolve(group));
    *size = h->group->size();
    return absl::OkStatus();
  });
}

int dcp_set_default_process_group(dcp_process_group_t* group) {
  return Guard([&]() -> absl::Status {
    absl::MutexLock lock(&dcp::capi::group_mu);
    dcp_process_group* h = nullptr;
    if (group != nullptr) {
      DCP_ASSIGN_OR_RETURN(h, Resolve(group));
    }
    dcp::capi::default_group = h;
    dcp::SetDefaultProcessGroup(h == nullptr ? nullptr : h->group.get());
    return absl::OkStatus();
  });
}

int dcp_process_group_free(dcp_process_group_t* group) {
  return Guard([&]() -> absl::Status {
    if (group == nullptr) return absl::OkStatus();
    {
      absl::MutexLock lock(&dcp::capi::group_mu);
      DCP_ASSIGN_OR_RETURN(dcp_process_group * h, Resolve(group));
      if (dcp::capi::default_group == h) {
        return absl::FailedPreconditionError(
            "the process group is the default group; call "
            "dcp_set_default_process_group(NULL) before freeing it");
      }
      if (h->users > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the process group is in use by ", h->users,
            " save(s) or load(s) in flight; wait for them (dcp_shutdown() "
            "waits for every async save) before freeing it"));
      }
      DCP_RETURN_IF_ERROR(
          dcp::capi::UnregisterHandle(group, dcp_process_group::kType));
    }
    delete group;
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------
// Save and load.

int dcp_save(const dcp_state_dict_t* sd, const dcp_save_options_t* options,
             dcp_metadata_t** metadata_out) {
  return Guard([&]() -> absl::Status {
    if (metadata_out != nullptr) *metadata_out = nullptr;
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<dcp::capi::SaveJob> job,
                         dcp::capi::PrepareSave(*h, options, /*async=*/false));
    DCP_ASSIGN_OR_RETURN(dcp::Metadata metadata,
                         dcp::Save(h->root, job->options));
    if (metadata_out != nullptr) {
      *metadata_out = Publish(new dcp_metadata(std::move(metadata)));
    }
    return absl::OkStatus();
  });
}

int dcp_load(dcp_state_dict_t* sd, const dcp_load_options_t* options) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(
        dcp_load_options_t in,
        dcp::capi::ReadVersioned(options, "dcp_load_options_t"));
    dcp::LoadOptions load;
    load.checkpoint_id = in.checkpoint_id == nullptr ? "" : in.checkpoint_id;
    std::shared_ptr<dcp::DeviceStaging> staging;  // Outlives the reader.
    std::shared_ptr<dcp::StorageReader> reader;
    if (in.storage_reader != nullptr) {
      DCP_ASSIGN_OR_RETURN(dcp_storage_reader * r, Resolve(in.storage_reader));
      reader = r->reader;
      staging = r->staging;
    } else if (load.checkpoint_id.empty()) {
      return absl::InvalidArgumentError(
          "a load needs dcp_load_options_t.checkpoint_id (a directory) or "
          "storage_reader");
    } else {
      // The storage the id names, or whose checkpoint the directory holds
      // (io/storage_registry.h), sharing the staging the wait orders.
      staging = std::make_shared<dcp::DeviceStaging>();
      dcp::FileSystemReaderOptions reader_options;
      reader_options.device_staging = staging.get();
      DCP_ASSIGN_OR_RETURN(const std::string backend,
                           dcp::StorageRegistry::Default().BackendFor(
                               load.checkpoint_id, /*for_load=*/true));
      if (backend == "mega") {
        reader = std::make_shared<dcp::MegaStorageReader>(load.checkpoint_id,
                                                          reader_options);
      } else if (backend == "huggingface") {
        dcp::HuggingFaceStorageReaderOptions hf_options;
        hf_options.device_staging = staging.get();
        reader = std::make_shared<dcp::HuggingFaceStorageReader>(
            load.checkpoint_id, hf_options);
      } else {
        reader = std::make_shared<dcp::FileSystemReader>(load.checkpoint_id,
                                                         reader_options);
      }
    }
    // The engine points the reader at checkpoint_id (Reset) and passes the
    // wait, each rank inside the load's shared setup step.
    dcp::capi::OrderedReader ordered(reader, staging);
    load.storage_reader = &ordered;
    DCP_ASSIGN_OR_RETURN(load.device_wait,
                         dcp::capi::DeviceWaitFromC(in.device_wait));
    DCP_ASSIGN_OR_RETURN(
        bool no_dist,
        dcp::capi::ReadFlag(in.no_dist, false, "dcp_load_options_t.no_dist"));
    DCP_ASSIGN_OR_RETURN(dcp::DefaultLoadPlannerOptions planner_options,
                         dcp::capi::LoadPlannerOptionsFromC(in.planner));
    dcp::DefaultLoadPlanner planner(planner_options);
    load.planner = &planner;
    load.coordinator_rank = in.coordinator_rank;
    DCP_ASSIGN_OR_RETURN(dcp::capi::GroupPin group,
                         dcp::capi::PinGroup(in.process_group, no_dist));
    load.process_group = group.get();
    load.no_dist = load.process_group == nullptr;
    DCP_RETURN_IF_ERROR(dcp::capi::CheckWritable(*h));
    absl::Status status = dcp::Load(h->root, load);
    h->Changed();  // Plain values were replaced, even by a failed load.
    return status;
  });
}

// ---------------------------------------------------------------------------
// Async save.

int dcp_async_save(const dcp_state_dict_t* sd,
                   const dcp_save_options_t* options, dcp_async_save_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_async_save_t**"));
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * h, Resolve(sd));
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<dcp::capi::SaveJob> prepared,
                         dcp::capi::PrepareSave(*h, options, /*async=*/true));
    std::shared_ptr<dcp::capi::SaveJob> job = std::move(prepared);
    dcp::AsyncSaveOptions async_options;
    async_options.save = job->options;
    async_options.async_stager = job->stager.get();
    dcp::AsyncSaveResponse response =
        dcp::capi::LibraryCheckpointer().AsyncSave(h->root, async_options);
    // The job (writer, planner, pinned group) lives until the upload ends,
    // whether or not the handle is freed first, and is released before
    // anyone sees the upload done: a waiter may free the group at once.
    dcp::Promise<dcp::Metadata> upload;
    response.upload_completion.OnReady(
        [job = std::move(job),
         upload](const absl::StatusOr<dcp::Metadata>& result) mutable {
          job.reset();
          upload.Set(result);
        });
    response.upload_completion = upload.future();
    dcp::capi::TrackUpload(response.upload_completion);
    auto handle = std::make_unique<dcp_async_save_t>();
    handle->staging = std::move(response.staging_completion);
    handle->upload = std::move(response.upload_completion);
    *out = Publish(handle.release());
    return absl::OkStatus();
  });
}

int dcp_stager_create(const dcp_stager_options_t* options, dcp_stager_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_stager_t**"));
    DCP_ASSIGN_OR_RETURN(dcp::StagingOptions staging,
                         dcp::capi::StagingOptionsFromC(options));
    auto handle = std::make_unique<dcp_stager_t>();
    handle->stager = std::make_shared<dcp::DefaultStager>(staging);
    *out = Publish(handle.release());
    return absl::OkStatus();
  });
}

int dcp_stager_reserve(dcp_stager_t* stager, const dcp_state_dict_t* sd) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_stager_t * h, Resolve(stager));
    DCP_ASSIGN_OR_RETURN(dcp_state_dict * state, Resolve(sd));
    return h->stager->Reserve(state->root).Wait();
  });
}

int dcp_stager_free(dcp_stager_t* stager) {
  // Saves still staging through it hold the stager itself.
  return dcp::capi::FreeHandle(stager);
}

int dcp_async_save_wait(dcp_async_save_t* save, int32_t which,
                        int64_t timeout_ms, int32_t* done) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(done, "int32_t* done"));
    *done = 0;
    DCP_ASSIGN_OR_RETURN(dcp_async_save_t * h, Resolve(save));
    DCP_RETURN_IF_ERROR(dcp::capi::CheckCompletion(which));
    if (which == DCP_STAGING) {
      return dcp::capi::WaitFor(h->staging, timeout_ms, done);
    }
    return dcp::capi::WaitFor(h->upload, timeout_ms, done);
  });
}

int dcp_async_save_on_done(dcp_async_save_t* save, int32_t which,
                           void (*callback)(void* user, int status),
                           void* user) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_async_save_t * h, Resolve(save));
    DCP_RETURN_IF_ERROR(dcp::capi::CheckCompletion(which));
    if (callback == nullptr) {
      return absl::InvalidArgumentError(
          "dcp_async_save_on_done: the callback is NULL");
    }
    if (which == DCP_STAGING) {
      dcp::capi::CallWhenDone(h->staging, callback, user);
    } else {
      dcp::capi::CallWhenDone(h->upload, callback, user);
    }
    return absl::OkStatus();
  });
}

int dcp_async_save_metadata(dcp_async_save_t* save, dcp_metadata_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_metadata_t**"));
    DCP_ASSIGN_OR_RETURN(dcp_async_save_t * h, Resolve(save));
    if (!h->upload.ready()) {
      return absl::FailedPreconditionError(
          "the async save's upload is not done yet; wait for DCP_UPLOAD "
          "first");
    }
    const absl::StatusOr<dcp::Metadata>& result = h->upload.Wait();
    if (!result.ok()) return result.status();
    *out = Publish(new dcp_metadata(*result));
    return absl::OkStatus();
  });
}

int dcp_async_save_free(dcp_async_save_t* save) {
  // The save goes on; see dcp_async_save.
  return dcp::capi::FreeHandle(save);
}

int dcp_shutdown(void) {
  return Guard([&]() -> absl::Status {
    if (dcp::capi::CallbackScope::Active()) {
      return absl::FailedPreconditionError(
          "dcp_shutdown called from an async save's callback would wait for "
          "itself; call it from the application's own thread");
    }
    dcp::capi::WaitForUploads();
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------
// Metadata.

int dcp_metadata_read(const char* checkpoint_id, dcp_metadata_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_metadata_t**"));
    if (checkpoint_id == nullptr || checkpoint_id[0] == '\0') {
      return absl::InvalidArgumentError(
          "dcp_metadata_read: checkpoint_id is NULL or empty");
    }
    // As `dcp inspect`: the reader's own metadata read and validation.
    dcp::FileSystemReader reader(checkpoint_id);
    DCP_RETURN_IF_ERROR(reader.Reset(checkpoint_id));
    DCP_ASSIGN_OR_RETURN(dcp::Metadata metadata, reader.ReadMetadata());
    *out = Publish(new dcp_metadata(std::move(metadata)));
    return absl::OkStatus();
  });
}

int dcp_metadata_free(dcp_metadata_t* md) { return dcp::capi::FreeHandle(md); }

int dcp_metadata_num_items(const dcp_metadata_t* md, size_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "size_t*"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    *out = h->items.size();
    return absl::OkStatus();
  });
}

int dcp_metadata_item(const dcp_metadata_t* md, size_t index,
                      dcp_item_info_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(dcp::capi::CheckOutStruct(out, "dcp_item_info_t"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    DCP_ASSIGN_OR_RETURN(const MetadataItem* item,
                         dcp::capi::ItemAt(*h, index));
    dcp_item_info_t info = {};
    info.name = item->name->c_str();
    info.path_len = item->path.size();
    if (item->tensor != nullptr) {
      info.is_tensor = 1;
      info.dtype = static_cast<int32_t>(item->tensor->properties.dtype);
      info.ndim = static_cast<int32_t>(item->tensor->size.size());
      info.shape = item->tensor->size.data();
      info.num_chunks = item->tensor->chunks.size();
      info.requires_grad = item->tensor->properties.requires_grad ? 1 : 0;
    }
    dcp::capi::WriteVersioned(info, out);
    return absl::OkStatus();
  });
}

int dcp_metadata_find(const dcp_metadata_t* md, const char* name,
                      size_t* index) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(index, "size_t* index"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    if (name == nullptr) {
      return absl::InvalidArgumentError("dcp_metadata_find: name is NULL");
    }
    const std::string key = name;
    const auto it =
        std::lower_bound(h->items.begin(), h->items.end(), key,
                         [](const MetadataItem& item, const std::string& k) {
                           return *item.name < k;
                         });
    if (it == h->items.end() || *it->name != key) {
      return absl::NotFoundError(
          absl::StrCat("the checkpoint has no item named \"", key, "\""));
    }
    *index = static_cast<size_t>(it - h->items.begin());
    return absl::OkStatus();
  });
}

int dcp_metadata_chunk(const dcp_metadata_t* md, size_t index, size_t chunk,
                       const int64_t** offsets, const int64_t** sizes) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(offsets, "offsets"));
    DCP_RETURN_IF_ERROR(CheckOut(sizes, "sizes"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    DCP_ASSIGN_OR_RETURN(const MetadataItem* item,
                         dcp::capi::ItemAt(*h, index));
    if (item->tensor == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata item \"", *item->name,
                       "\" is a plain value, not a tensor: it has no chunks"));
    }
    if (chunk >= item->tensor->chunks.size()) {
      return absl::OutOfRangeError(absl::StrCat(
          "chunk ", chunk, " of tensor \"", *item->name,
          "\" is out of range; it has ", item->tensor->chunks.size()));
    }
    *offsets = item->tensor->chunks[chunk].offsets.data();
    *sizes = item->tensor->chunks[chunk].sizes.data();
    return absl::OkStatus();
  });
}

int dcp_metadata_item_path(const dcp_metadata_t* md, size_t index, size_t elem,
                           dcp_path_elem_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_path_elem_t*"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    DCP_ASSIGN_OR_RETURN(const MetadataItem* item,
                         dcp::capi::ItemAt(*h, index));
    if (elem >= item->path.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("path element ", elem, " of item \"", *item->name,
                       "\" is out of range; its path has ", item->path.size()));
    }
    const dcp::PathElement& element = item->path[elem];
    if (const auto* key = std::get_if<std::string>(&element)) {
      out->key = key->c_str();
      out->index = -1;
    } else {
      out->key = nullptr;
      out->index = std::get<int64_t>(element);
    }
    return absl::OkStatus();
  });
}

int dcp_metadata_version(const dcp_metadata_t* md, const char** version) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(version, "const char** version"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    *version = h->metadata.version.c_str();
    return absl::OkStatus();
  });
}

int dcp_metadata_num_storage(const dcp_metadata_t* md, size_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "size_t*"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    *out = h->storage.size();
    return absl::OkStatus();
  });
}

int dcp_metadata_storage(const dcp_metadata_t* md, size_t index,
                         dcp_storage_info_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(dcp::capi::CheckOutStruct(out, "dcp_storage_info_t"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    if (index >= h->storage.size()) {
      return absl::OutOfRangeError(absl::StrCat("storage entry index ", index,
                                                " is out of range; there are ",
                                                h->storage.size(), " entries"));
    }
    const auto& [key, where] = *h->storage[index];
    dcp_storage_info_t info = {};
    info.name = key.fqn.c_str();
    if (key.offset.has_value()) {
      info.has_offsets = 1;
      info.ndim = static_cast<int32_t>(key.offset->size());
      info.offsets = key.offset->data();
    }
    info.relative_path = where.relative_path.c_str();
    info.offset = where.offset;
    info.length = where.length;
    dcp::capi::WriteVersioned(info, out);
    return absl::OkStatus();
  });
}

int dcp_storage_reader_read_metadata(dcp_storage_reader_t* reader,
                                     const char* checkpoint_id,
                                     dcp_metadata_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_metadata_t**"));
    DCP_ASSIGN_OR_RETURN(dcp_storage_reader * r, Resolve(reader));
    if (checkpoint_id != nullptr) {
      if (checkpoint_id[0] == '\0') {
        return absl::InvalidArgumentError(
            "dcp_storage_reader_read_metadata: checkpoint_id is empty (pass "
            "NULL to keep the reader's location)");
      }
      DCP_RETURN_IF_ERROR(r->reader->Reset(checkpoint_id));
    } else {
      DCP_RETURN_IF_ERROR(r->reader->Reset(""));
    }
    DCP_ASSIGN_OR_RETURN(dcp::Metadata metadata, r->reader->ReadMetadata());
    *out = Publish(new dcp_metadata(std::move(metadata)));
    return absl::OkStatus();
  });
}

int dcp_metadata_ids(const dcp_metadata_t* md, const char** checkpoint_id,
                     const char** save_id) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    if (checkpoint_id != nullptr) *checkpoint_id = h->checkpoint_id.c_str();
    if (save_id != nullptr) *save_id = h->save_id.c_str();
    return absl::OkStatus();
  });
}

}  // extern "C"
