// StorageRegistry: which storage a save or load uses when the caller gives
// a checkpoint_id and no StorageWriter/StorageReader (the seed's save/load
// pick one from the checkpoint_id). A backend is a name, the URI schemes it
// owns and factories; the default registry knows
//
//   native       plain paths (FileSystemWriter/FileSystemReader)
//   mega         `mega://DIR` URIs, and plain directories holding
//                `model.mega.index.json` on load (io/mega_storage.h)
//   huggingface  plain directories holding `model.safetensors.index.json`
//                or `*.safetensors` files, on load only (io/hf_storage.h)
//
// and programs register their own (Register). The rules:
//
// - `scheme://rest` (scheme: a letter, then letters, digits, '+', '-',
//   '.') goes to the backend that owns the scheme, given the whole id; an
//   unknown scheme is kInvalidArgument listing the known ones.
// - A plain path saves with the default backend (native). A plain path
//   loads with the first backend, in registration order, whose `detect`
//   says the directory holds its checkpoint; when none does, with the
//   default backend (whose reader then says what is missing). The native
//   backend detects a dcp metadata file (`.metadata`, or `rank-0/.metadata`
//   of a rank-local save); the built-in backends are registered before any
//   other, so a directory with dcp metadata loads natively even if it
//   holds safetensors files too.
//
// Thread safety: all methods are thread-safe; the factories run outside the
// registry's lock.
#ifndef DCP_IO_STORAGE_REGISTRY_H_
#define DCP_IO_STORAGE_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"
#include "io/storage.h"

namespace dcp {

struct StorageBackend {
  // For messages and Register's uniqueness check ("mega").
  std::string name;
  // URI schemes it owns, without "://" ("mega").
  std::vector<std::string> schemes;
  // Whether the plain directory `path` holds a checkpoint of this backend
  // (for loads from plain paths). Null: never chosen for a plain path.
  std::function<absl::StatusOr<bool>(FileSystemBase& fs,
                                     const std::string& path)>
      detect;
  // Make a writer/reader for `checkpoint_id` (a URI of one of `schemes` or
  // a plain path) at that location: Save/Load then Reset it with an empty
  // id (a fresh save, the location kept). Null: the backend cannot save (or
  // load); asking for one is kInvalidArgument.
  std::function<absl::StatusOr<std::unique_ptr<StorageWriter>>(
      const std::string& checkpoint_id)>
      make_writer;
  std::function<absl::StatusOr<std::unique_ptr<StorageReader>>(
      const std::string& checkpoint_id)>
      make_reader;
};

// The scheme of `checkpoint_id` ("mega" for "mega://x"), or "" for a plain
// path.
std::string CheckpointIdScheme(absl::string_view checkpoint_id);

class StorageRegistry {
 public:
  // An empty registry; `default_backend` names the backend for plain paths
  // (it must be registered before CreateWriter/CreateReader are used).
  // `file_system` (not owned; nullptr: LocalFileSystem()) is what `detect`
  // functions are given.
  explicit StorageRegistry(std::string default_backend = "native",
                           FileSystemBase* file_system = nullptr);

  // The process-wide registry Save and Load use, with the built-in
  // backends (see the file comment) registered.
  static StorageRegistry& Default();

  // Adds `backend`. kAlreadyExists when its name or one of its schemes is
  // taken; kInvalidArgument for an empty name or a malformed scheme.
  absl::Status Register(StorageBackend backend);
  // Removes the backend named `name` (kNotFound when there is none).
  absl::Status Unregister(absl::string_view name);

  // A writer / reader for `checkpoint_id` (see the file comment for the
  // choice). kInvalidArgument for an empty id, an unknown scheme (listing
  // the known ones), or a backend without that factory; the factory's own
  // errors.
  absl::StatusOr<std::unique_ptr<StorageWriter>> CreateWriter(
      const std::string& checkpoint_id) const;
  absl::StatusOr<std::unique_ptr<StorageReader>> CreateReader(
      const std::string& checkpoint_id) const;

  // The name of the backend a save to / load from `checkpoint_id` uses.
  absl::StatusOr<std::string> BackendFor(const std::string& checkpoint_id,
                                         bool for_load) const;

  // Every registered scheme, sorted ("mega").
  std::vector<std::string> schemes() const;

 private:
  absl::StatusOr<StorageBackend> Choose(const std::string& checkpoint_id,
                                        bool for_load) const;

  const std::string default_backend_;
  FileSystemBase* const fs_;
  mutable absl::Mutex mu_;
  std::vector<StorageBackend> backends_ ABSL_GUARDED_BY(mu_);
};

// The native backend's detection: `path` holds `.metadata` or
// `rank-0/.metadata`.
absl::StatusOr<bool> HasDcpMetadata(FileSystemBase& fs,
                                    const std::string& path);

}  // namespace dcp

#endif  // DCP_IO_STORAGE_REGISTRY_H_
