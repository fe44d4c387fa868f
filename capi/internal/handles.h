// The C ABI's handle types: what each opaque handle of dcp/dcp.h is inside
// the library. Every handle starts with a HandleTag and is registered while
// it lives (capi/internal/registry.h).
//
// Thread safety: as dcp/dcp.h says, one save or load at a time per state
// dict, writer, reader or group handle; the caches of a state dict and the
// users count of a process group are guarded for concurrent getters.
#ifndef DCP_CAPI_INTERNAL_HANDLES_H_
#define DCP_CAPI_INTERNAL_HANDLES_H_

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "capi/internal/last_error.h"
#include "capi/internal/registry.h"
#include "comm/process_group.h"
#include "core/future.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "dcp/dcp.h"
#include "io/storage.h"
#include "planner/metadata.h"
#include "staging/cow_snapshot.h"
#include "staging/device_staging.h"
#include "staging/stager.h"

struct dcp_state_dict {
  static constexpr dcp::capi::HandleType kType =
      dcp::capi::HandleType::kStateDict;
  dcp::capi::HandleTag tag{kType};

  dcp::StateDict root;
  // Paths of tensors whose DLPack producer marked them read-only: a load
  // must not write into them.
  std::set<dcp::ObjectPath> read_only;
  // Paths of tensors marked with dcp_state_dict_mark_requires_grad; a leaf
  // set again loses its mark.
  std::set<dcp::ObjectPath> requires_grad;

  // The flattened leaves (name, leaf in `root`), sorted by name, built on
  // demand for the getters; reset by every change to `root`.
  absl::Mutex cache_mu;
  std::optional<std::vector<std::pair<std::string, dcp::StateValue*>>> leaves
      ABSL_GUARDED_BY(cache_mu);

  void Changed() {
    absl::MutexLock lock(&cache_mu);
    leaves.reset();
  }
};

// One item of a checkpoint's metadata as dcp_metadata_item reports it.
struct MetadataItem {
  const std::string* name;                   // Key in the metadata.
  const dcp::TensorStorageMetadata* tensor;  // NULL for bytes values.
  dcp::ObjectPath path;                      // The nesting path.
};

struct dcp_metadata {
  static constexpr dcp::capi::HandleType kType =
      dcp::capi::HandleType::kMetadata;
  dcp::capi::HandleTag tag{kType};

  explicit dcp_metadata(dcp::Metadata metadata_in);

  dcp::Metadata metadata;
  std::vector<MetadataItem> items;  // In flattened-name order.
  // The entries of metadata.storage_data, in its order.
  std::vector<const std::pair<const dcp::MetadataIndex, dcp::StorageInfo>*>
      storage;
  std::string checkpoint_id;
  std::string save_id;

  // The packed forms of the items and of the storage entries
  // (dcp_metadata_items_packed, dcp_metadata_storage_packed), made on the
  // first call and kept until the handle is freed.
  struct Packed {
    std::vector<int64_t> records;
    std::string text;
  };
  absl::Mutex packed_mu;
  std::optional<Packed> packed_items ABSL_GUARDED_BY(packed_mu);
  std::optional<Packed> packed_storage ABSL_GUARDED_BY(packed_mu);
};

struct dcp_storage_writer {
  static constexpr dcp::capi::HandleType kType =
      dcp::capi::HandleType::kStorageWriter;
  dcp::capi::HandleTag tag{kType};

  // A FileSystemWriter or HuggingFaceStorageWriter; shared with async
  // saves still uploading through it.
  std::shared_ptr<dcp::StorageWriter> writer;
};

struct dcp_storage_reader {
  static constexpr dcp::capi::HandleType kType =
      dcp::capi::HandleType::kStorageReader;
  dcp::capi::HandleTag tag{kType};

  // The reader's device staging (its options' device_staging), so that a
  // load can order the reader's device copies after the caller's stream
  // (dcp_load_options_t.device_wait). Declared first: outlives the reader.
  std::shared_ptr<dcp::DeviceStaging> staging;
  // A FileSystemReader or HuggingFaceStorageReader.
  std::shared_ptr<dcp::StorageReader> reader;
};

struct dcp_process_group {
  static constexpr dcp::capi::HandleType kType =
      dcp::capi::HandleType::kProcessGroup;
  dcp::capi::HandleTag tag{kType};

  std::unique_ptr<dcp::comm::ProcessGroup> group;
  // Saves and loads using the group now (guarded by the library's group
  // lock, see capi/internal/group_pin.h): a group in use cannot be freed.
  int users = 0;
};

struct dcp_async_save {
  static constexpr dcp::capi::HandleType kType =
      dcp::capi::HandleType::kAsyncSave;
  dcp::capi::HandleTag tag{kType};

  dcp::Future<void> staging;
  dcp::Future<dcp::Metadata> upload;
};

struct dcp_stager {
  static constexpr dcp::capi::HandleType kType = dcp::capi::HandleType::kStager;
  dcp::capi::HandleTag tag{kType};

  // Shared with the async saves staging through it, until their uploads end.
  std::shared_ptr<dcp::DefaultStager> stager;
};

struct dcp_host_snapshot {
  static constexpr dcp::capi::HandleType kType =
      dcp::capi::HandleType::kHostSnapshot;
  dcp::capi::HandleTag tag{kType};

  // Ready when every byte is copied; waited for before the handle goes.
  dcp::Future<dcp::CowSnapshotStats> filled;
  ~dcp_host_snapshot() {
    if (filled.valid()) filled.Wait().IgnoreError();
  }
};

namespace dcp::capi {

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

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_HANDLES_H_
