// The C ABI's storage handles: the writers and readers of the native
// format (dcp_fs_*), Hugging Face safetensors (dcp_hf_*, including the
// quantized reader) and MEGA (dcp_mega_*), and freeing them.
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "capi/internal/handles.h"
#include "capi/internal/last_error.h"
#include "capi/internal/options.h"
#include "capi/internal/registry.h"
#include "core/status.h"
#include "dcp/dcp.h"
#include "io/file_system_storage.h"
#include "io/hf_quantized_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"
#include "staging/device_staging.h"

namespace dcp::capi {
namespace {

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

}  // namespace
}  // namespace dcp::capi

using dcp::capi::Guard;

extern "C" {

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

}  // extern "C"
