// The C ABI's saves and loads: dcp_save, dcp_load, dcp_async_save and its
// completions, the stagers async saves stage through, and dcp_shutdown.
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "capi/internal/async_uploads.h"
#include "capi/internal/group_pin.h"
#include "capi/internal/handles.h"
#include "capi/internal/host_copies.h"
#include "capi/internal/last_error.h"
#include "capi/internal/options.h"
#include "capi/internal/ordered_reader.h"
#include "capi/internal/registry.h"
#include "capi/internal/state_tree.h"
#include "core/future.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "dcp/dcp.h"
#include "engine/async_save.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"
#include "io/storage_registry.h"
#include "planner/default_planner.h"
#include "staging/device_box_upload.h"
#include "staging/device_staging.h"
#include "staging/host_buffer_pool.h"
#include "staging/stager.h"

namespace dcp::capi {
namespace {

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
  if (timeout_ms != 0 && CallbackScope::Active() && !future.ready()) {
    // Completions (and callbacks) run on dcp threads one at a time: the one
    // this waits for could be queued behind this callback.
    return absl::FailedPreconditionError(
        "dcp_async_save_wait with a timeout, called from an async save's "
        "callback, for a completion that is not done would block the dcp "
        "thread that completes saves; wait from the application's own "
        "thread (or pass timeout 0)");
  }
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
    absl::Status backend_failure;  // The reader is then a placeholder.
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
      absl::StatusOr<std::string> backend =
          dcp::StorageRegistry::Default().BackendFor(load.checkpoint_id,
                                                     /*for_load=*/true);
      if (!backend.ok()) {
        backend_failure = backend.status();
        reader = std::make_shared<dcp::FileSystemReader>(load.checkpoint_id,
                                                         reader_options);
      } else if (*backend == "mega") {
        reader = std::make_shared<dcp::MegaStorageReader>(load.checkpoint_id,
                                                          reader_options);
      } else if (*backend == "huggingface") {
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
    if (!backend_failure.ok()) ordered.FailResets(backend_failure);
    load.storage_reader = &ordered;
    DCP_ASSIGN_OR_RETURN(load.device_wait,
                         dcp::capi::DeviceWaitFromC(in.device_wait));
    DCP_ASSIGN_OR_RETURN(
        bool no_dist,
        dcp::capi::ReadFlag(in.no_dist, false, "dcp_load_options_t.no_dist"));
    DCP_ASSIGN_OR_RETURN(dcp::DefaultLoadPlannerOptions planner_options,
                         dcp::capi::LoadPlannerOptionsFromC(in.planner));
    dcp::DefaultLoadPlanner planner(planner_options);
    // Converted chunks of device destinations go through the staging the
    // wait orders, flushed before the read completes (OrderedReader).
    planner.SetDeviceConversion([staging](const std::byte* src, dcp::DType from,
                                          const dcp::TensorView& dst) {
      return dcp::ConvertUpload(*staging, src, from, dst);
    });
    load.planner = &planner;
    load.coordinator_rank = in.coordinator_rank;
    if (in.metadata != nullptr) {
      DCP_ASSIGN_OR_RETURN(dcp_metadata * md, Resolve(in.metadata));
      load.metadata = &md->metadata;
    }
    DCP_ASSIGN_OR_RETURN(dcp::capi::GroupPin group,
                         dcp::capi::PinGroup(in.process_group, no_dist));
    load.process_group = group.get();
    load.no_dist = load.process_group == nullptr;
    // A read-only destination is this rank's own finding: it fails inside
    // the load's shared setup, so every rank fails, naming this one.
    load.local_failure = dcp::capi::CheckWritable(*h);
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

namespace {

// `copies` of dcp_copy_host / dcp_snapshot_host (named `function`):
// non-null where count > 0, non-null pointers where bytes > 0.
absl::Status CheckHostCopies(const char* function,
                             const dcp_host_copy_t* copies, size_t count) {
  if (count > 0 && copies == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(function, ": copies is NULL with count ", count));
  }
  for (size_t i = 0; i < count; ++i) {
    if (copies[i].bytes > 0 &&
        (copies[i].dst == nullptr || copies[i].src == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat(function, ": copies[", i, "] has a NULL ",
                       copies[i].dst == nullptr ? "dst" : "src", " and ",
                       copies[i].bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int dcp_copy_host(const dcp_host_copy_t* copies, size_t count, int threads) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckHostCopies("dcp_copy_host", copies, count));
    if (count == 0) return absl::OkStatus();
    dcp::capi::CopyHost(absl::MakeConstSpan(copies, count), threads);
    return absl::OkStatus();
  });
}

int dcp_populate_host(void* data, size_t bytes) {
  return Guard([&]() -> absl::Status {
    if (data == nullptr && bytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dcp_populate_host: data is NULL with ", bytes, " bytes"));
    }
    // The whole pages inside the range (madvise takes page-aligned ranges).
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t start = reinterpret_cast<uintptr_t>(data);
    const uintptr_t lo = (start + page - 1) / page * page;
    const uintptr_t hi = (start + bytes) / page * page;
    if (hi > lo) {
      return dcp::Annotate(
          dcp::PopulateHostMemory(reinterpret_cast<std::byte*>(lo), hi - lo),
          "dcp_populate_host");
    }
    return absl::OkStatus();
  });
}

int dcp_snapshot_host(const dcp_host_copy_t* copies, size_t count, int threads,
                      dcp_host_snapshot_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_host_snapshot_t**"));
    *out = nullptr;
    DCP_RETURN_IF_ERROR(CheckHostCopies("dcp_snapshot_host", copies, count));
    auto handle = std::make_unique<dcp_host_snapshot_t>();
    std::vector<dcp::HostCopy> all;
    all.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      all.push_back({static_cast<std::byte*>(copies[i].dst),
                     static_cast<const std::byte*>(copies[i].src),
                     copies[i].bytes});
    }
    std::vector<dcp_host_copy_t> now;
    absl::StatusOr<dcp::CowSnapshot> snapshot = dcp::TakeCowSnapshot(all);
    if (snapshot.ok()) {
      for (const dcp::HostCopy& c : snapshot->to_copy) {
        now.push_back({c.dst, c.src, c.bytes});
      }
      handle->filled = snapshot->filled;
    } else if (snapshot.status().code() == absl::StatusCode::kUnavailable) {
      now.assign(copies, copies + count);
      handle->filled =
          dcp::Future<dcp::CowSnapshotStats>::Ready(dcp::CowSnapshotStats{});
    } else {
      return snapshot.status();
    }
    dcp::capi::CopyHost(now, threads);
    *out = Publish(handle.release());
    return absl::OkStatus();
  });
}

int dcp_host_snapshot_wait(dcp_host_snapshot_t* snapshot,
                           size_t* copy_on_write_bytes) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_host_snapshot_t * h, Resolve(snapshot));
    const absl::StatusOr<dcp::CowSnapshotStats>& stats = h->filled.Wait();
    if (!stats.ok()) return stats.status();
    if (copy_on_write_bytes != nullptr) {
      *copy_on_write_bytes = stats->protected_bytes;
    }
    return absl::OkStatus();
  });
}

int dcp_host_snapshot_free(dcp_host_snapshot_t* snapshot) {
  return dcp::capi::FreeHandle(snapshot);  // Its destructor waits.
}

int dcp_stager_copy_on_write_bytes(const dcp_stager_t* stager, size_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "size_t*"));
    DCP_ASSIGN_OR_RETURN(const dcp_stager_t* h, Resolve(stager));
    *out = h->stager->copy_on_write_bytes();
    return absl::OkStatus();
  });
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

}  // extern "C"
