#include "capi/internal/registry.h"

#include <cstdint>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dcp::capi {
namespace {

ABSL_CONST_INIT absl::Mutex registry_mu(absl::kConstInit);

// Never destroyed: handles may be checked during static destruction (an
// upload finishing at exit).
absl::flat_hash_map<const void*, HandleType>& Live()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  static auto* const live = new absl::flat_hash_map<const void*, HandleType>();
  return *live;
}

absl::Status Check(const void* handle, HandleType type)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  if (handle == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(HandleTypeName(type), " handle is NULL"));
  }
  const auto it = Live().find(handle);
  if (it == Live().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(handle)),
                     " is not a live ", HandleTypeName(type),
                     " handle (already freed, or never returned by dcp)"));
  }
  if (it->second != type) {
    return absl::InvalidArgumentError(absl::StrCat(
        "0x", absl::Hex(reinterpret_cast<uintptr_t>(handle)), " is a ",
        HandleTypeName(it->second), " handle, not a ", HandleTypeName(type)));
  }
  return absl::OkStatus();
}

}  // namespace

const char* HandleTypeName(HandleType type) {
  switch (type) {
    case HandleType::kStateDict:
      return "dcp_state_dict_t";
    case HandleType::kMetadata:
      return "dcp_metadata_t";
    case HandleType::kStorageWriter:
      return "dcp_storage_writer_t";
    case HandleType::kStorageReader:
      return "dcp_storage_reader_t";
    case HandleType::kProcessGroup:
      return "dcp_process_group_t";
    case HandleType::kAsyncSave:
      return "dcp_async_save_t";
    case HandleType::kStager:
      return "dcp_stager_t";
    case HandleType::kHostSnapshot:
      return "dcp_host_snapshot_t";
  }
  return "dcp handle";
}

void RegisterHandle(const void* handle, HandleType type) {
  absl::MutexLock lock(&registry_mu);
  Live()[handle] = type;
}

absl::Status CheckHandle(const void* handle, HandleType type) {
  absl::MutexLock lock(&registry_mu);
  return Check(handle, type);
}

absl::Status UnregisterHandle(const void* handle, HandleType type) {
  absl::MutexLock lock(&registry_mu);
  absl::Status status = Check(handle, type);
  if (status.ok()) Live().erase(handle);
  return status;
}

}  // namespace dcp::capi
