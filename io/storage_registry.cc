#include "io/storage_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "io/checkpoint_formats.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"

namespace dcp {
namespace {

bool IsSchemeName(absl::string_view s) {
  if (s.empty() || !absl::ascii_isalpha(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '+' ||
           c == '-' || c == '.';
  });
}

// Whether `path` holds a checkpoint of `format` by its fixed file names
// (io/checkpoint_formats.h).
absl::StatusOr<bool> HoldsFormat(FileSystemBase& fs, const std::string& path,
                                 CheckpointFormat format) {
  DCP_ASSIGN_OR_RETURN(std::string evidence,
                       CheckpointFormatEvidence(fs, path, format,
                                                /*list=*/false));
  return !evidence.empty();
}

void RegisterBuiltIns(StorageRegistry& registry) {
  StorageBackend native;
  native.name = "native";
  native.detect = HasDcpMetadata;
  native.make_writer = [](const std::string& id)
      -> absl::StatusOr<std::unique_ptr<StorageWriter>> {
    return std::make_unique<FileSystemWriter>(id);
  };
  native.make_reader = [](const std::string& id)
      -> absl::StatusOr<std::unique_ptr<StorageReader>> {
    return std::make_unique<FileSystemReader>(id);
  };
  StorageBackend mega;
  mega.name = "mega";
  mega.schemes = {kMegaScheme};
  mega.detect = [](FileSystemBase& fs, const std::string& path) {
    return HoldsFormat(fs, path, CheckpointFormat::kMega);
  };
  mega.make_writer = [](const std::string& id)
      -> absl::StatusOr<std::unique_ptr<StorageWriter>> {
    DCP_ASSIGN_OR_RETURN(std::string dir, MegaPathFromId(id));
    return std::make_unique<MegaStorageWriter>(dir);
  };
  mega.make_reader = [](const std::string& id)
      -> absl::StatusOr<std::unique_ptr<StorageReader>> {
    DCP_ASSIGN_OR_RETURN(std::string dir, MegaPathFromId(id));
    return std::make_unique<MegaStorageReader>(dir);
  };
  StorageBackend hf;
  hf.name = "huggingface";
  // A directory the Hugging Face reader would read (an index, a single
  // file, *.safetensors there or in sharded/), or one whose commit was
  // interrupted or whose index is broken: its reader says so.
  hf.detect = [](FileSystemBase& fs,
                 const std::string& path) -> absl::StatusOr<bool> {
    absl::StatusOr<std::vector<std::string>> files =
        ResolveHfCheckpointFiles(fs, path);
    if (absl::IsNotFound(files.status())) return false;
    return true;
  };
  hf.make_reader = [](const std::string& id)
      -> absl::StatusOr<std::unique_ptr<StorageReader>> {
    return std::make_unique<HuggingFaceStorageReader>(id);
  };
  for (StorageBackend* backend : {&native, &mega, &hf}) {
    registry.Register(std::move(*backend)).IgnoreError();
  }
}

}  // namespace

std::string CheckpointIdScheme(absl::string_view checkpoint_id) {
  const size_t at = checkpoint_id.find("://");
  if (at == absl::string_view::npos) return "";
  const absl::string_view scheme = checkpoint_id.substr(0, at);
  return IsSchemeName(scheme) ? std::string(scheme) : "";
}

absl::StatusOr<bool> HasDcpMetadata(FileSystemBase& fs,
                                    const std::string& path) {
  return HoldsFormat(fs, path, CheckpointFormat::kDcp);
}

StorageRegistry::StorageRegistry(std::string default_backend,
                                 FileSystemBase* file_system)
    : default_backend_(std::move(default_backend)),
      fs_(file_system != nullptr ? file_system : &LocalFileSystem()) {}

StorageRegistry& StorageRegistry::Default() {
  static StorageRegistry* registry = [] {
    auto* r = new StorageRegistry();
    RegisterBuiltIns(*r);
    return r;
  }();
  return *registry;
}

absl::Status StorageRegistry::Register(StorageBackend backend) {
  if (backend.name.empty()) {
    return absl::InvalidArgumentError("a storage backend needs a name");
  }
  for (const std::string& scheme : backend.schemes) {
    if (!IsSchemeName(scheme)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "storage backend \"", backend.name, "\": \"", scheme,
          "\" is not a URI scheme (a letter, then letters, digits, + - .)"));
    }
  }
  absl::MutexLock lock(&mu_);
  for (const StorageBackend& b : backends_) {
    if (b.name == backend.name) {
      return absl::AlreadyExistsError(absl::StrCat("a storage backend named \"",
                                                   b.name, "\" is registered"));
    }
    for (const std::string& scheme : backend.schemes) {
      if (std::find(b.schemes.begin(), b.schemes.end(), scheme) !=
          b.schemes.end()) {
        return absl::AlreadyExistsError(
            absl::StrCat("the scheme ", scheme,
                         ":// belongs to storage backend \"", b.name, "\""));
      }
    }
  }
  backends_.push_back(std::move(backend));
  return absl::OkStatus();
}

absl::Status StorageRegistry::Unregister(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it =
      std::find_if(backends_.begin(), backends_.end(),
                   [&](const StorageBackend& b) { return b.name == name; });
  if (it == backends_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no storage backend named \"", name, "\""));
  }
  backends_.erase(it);
  return absl::OkStatus();
}

std::vector<std::string> StorageRegistry::schemes() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const StorageBackend& b : backends_) {
    out.insert(out.end(), b.schemes.begin(), b.schemes.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<StorageBackend> StorageRegistry::Choose(
    const std::string& checkpoint_id, bool for_load) const {
  if (checkpoint_id.empty()) {
    return absl::InvalidArgumentError(
        "an empty checkpoint_id names no storage");
  }
  std::vector<StorageBackend> backends;
  {
    absl::MutexLock lock(&mu_);
    backends = backends_;
  }
  const std::string scheme = CheckpointIdScheme(checkpoint_id);
  if (!scheme.empty()) {
    for (const StorageBackend& b : backends) {
      if (std::find(b.schemes.begin(), b.schemes.end(), scheme) !=
          b.schemes.end()) {
        return b;
      }
    }
    std::vector<std::string> known = schemes();
    for (std::string& s : known) s += "://";
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint_id \"", checkpoint_id, "\" has the unknown scheme ", scheme,
        "://; known: ", known.empty() ? "none" : absl::StrJoin(known, ", "),
        ", or a plain directory path"));
  }
  if (for_load) {
    for (const StorageBackend& b : backends) {
      if (!b.detect || !b.make_reader) continue;
      DCP_ASSIGN_OR_RETURN(bool found, b.detect(*fs_, checkpoint_id));
      if (found) return b;
    }
  }
  for (const StorageBackend& b : backends) {
    if (b.name == default_backend_) return b;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the default storage backend \"", default_backend_,
                   "\" is not registered"));
}

absl::StatusOr<std::string> StorageRegistry::BackendFor(
    const std::string& checkpoint_id, bool for_load) const {
  DCP_ASSIGN_OR_RETURN(StorageBackend b, Choose(checkpoint_id, for_load));
  return b.name;
}

absl::StatusOr<std::unique_ptr<StorageWriter>> StorageRegistry::CreateWriter(
    const std::string& checkpoint_id) const {
  DCP_ASSIGN_OR_RETURN(StorageBackend b, Choose(checkpoint_id, false));
  if (!b.make_writer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "storage backend \"", b.name, "\" cannot save (", checkpoint_id, ")"));
  }
  return b.make_writer(checkpoint_id);
}

absl::StatusOr<std::unique_ptr<StorageReader>> StorageRegistry::CreateReader(
    const std::string& checkpoint_id) const {
  DCP_ASSIGN_OR_RETURN(StorageBackend b, Choose(checkpoint_id, true));
  if (!b.make_reader) {
    return absl::InvalidArgumentError(absl::StrCat(
        "storage backend \"", b.name, "\" cannot load (", checkpoint_id, ")"));
  }
  return b.make_reader(checkpoint_id);
}

}  // namespace dcp
