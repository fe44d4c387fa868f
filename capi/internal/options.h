// The C ABI's versioned option structs (dcp/dcp.h): reading them with their
// struct_size rules and mapping them onto the engine's option structs.
//
// Rules: a NULL struct means all defaults; struct_size 0 or larger than the
// library's struct is kInvalidArgument; a smaller one (a caller built
// against an older header) covers a prefix, the rest defaults. Zero means
// the default in every field.
//
// Thread safety: the functions touch only their arguments.
#ifndef DCP_CAPI_INTERNAL_OPTIONS_H_
#define DCP_CAPI_INTERNAL_OPTIONS_H_

#include <cstring>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "comm/process_group_factory.h"
#include "core/device.h"
#include "dcp/dcp.h"
#include "io/file_system_storage.h"
#include "io/hf_quantized_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"
#include "planner/default_planner.h"
#include "staging/stager.h"

namespace dcp::capi {

// kInvalidArgument naming `type_name` unless 0 < struct_size <= `size`.
absl::Status CheckStructSize(size_t struct_size, size_t size,
                             const char* type_name);

// The caller's struct `in` (NULL: defaults) as the library's full struct.
template <typename T>
absl::StatusOr<T> ReadVersioned(const T* in, const char* type_name) {
  T out;
  std::memset(&out, 0, sizeof(out));
  out.struct_size = sizeof(T);
  if (in == nullptr) return out;
  absl::Status status = CheckStructSize(in->struct_size, sizeof(T), type_name);
  if (!status.ok()) return status;
  std::memcpy(&out, in, in->struct_size);
  out.struct_size = sizeof(T);
  return out;
}

// An output pointer: kInvalidArgument naming `what` when it is NULL. A
// handle (or other pointer) output is set to NULL here, so that a call that
// fails leaves NULL there (dcp.h's conventions), never the caller's garbage.
template <typename T>
absl::Status CheckOut(T* out, const char* what) {
  if (out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the output pointer ", what, " is NULL"));
  }
  if constexpr (std::is_pointer_v<T>) *out = nullptr;
  return absl::OkStatus();
}

// An output struct the caller sized: checks `out` (not NULL, struct_size)
// before the call fills anything.
template <typename T>
absl::Status CheckOutStruct(const T* out, const char* type_name) {
  if (out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", type_name, " output pointer is NULL"));
  }
  return CheckStructSize(out->struct_size, sizeof(T), type_name);
}

// Copies the part of `full` that the caller's `out` has room for (its
// struct_size, checked by CheckOutStruct), keeping out->struct_size.
template <typename T>
void WriteVersioned(T full, T* out) {
  full.struct_size = out->struct_size;
  std::memcpy(out, &full, out->struct_size);
}

// A dcp_flag_t field: DCP_DEFAULT -> `default_value`. kInvalidArgument
// naming `field` for values other than DCP_DEFAULT, DCP_TRUE, DCP_FALSE.
absl::StatusOr<bool> ReadFlag(dcp_flag_t flag, bool default_value,
                              const char* field);

absl::StatusOr<FileSystemWriterOptions> WriterOptionsFromC(
    const dcp_fs_writer_options_t* options);
absl::StatusOr<FileSystemReaderOptions> ReaderOptionsFromC(
    const dcp_fs_reader_options_t* options);
// The mapping's fqns are copied; kInvalidArgument naming the field for a
// NULL array with entries, a NULL or duplicate fqn, a file index below 1.
absl::StatusOr<HuggingFaceStorageWriterOptions> HfWriterOptionsFromC(
    const dcp_hf_writer_options_t* options);
absl::StatusOr<HuggingFaceStorageReaderOptions> HfReaderOptionsFromC(
    const dcp_hf_reader_options_t* options);
// kInvalidArgument naming the field for a target_dtype other than 0,
// F32, BF16, F16.
absl::StatusOr<QuantizedHuggingFaceStorageReaderOptions>
HfQuantizedReaderOptionsFromC(const dcp_hf_quantized_reader_options_t* options);
// The mapping as HfWriterOptionsFromC's.
absl::StatusOr<MegaStorageWriterOptions> MegaWriterOptionsFromC(
    const dcp_mega_writer_options_t* options);
absl::StatusOr<MegaStorageReaderOptions> MegaReaderOptionsFromC(
    const dcp_mega_reader_options_t* options);
// The seed's DefaultStager defaults (every switch on) for DCP_DEFAULT.
absl::StatusOr<StagingOptions> StagingOptionsFromC(
    const dcp_stager_options_t* options);
// `require_full_coverage` is the engine's choice (see Save), not the C
// caller's.
absl::StatusOr<DefaultSavePlannerOptions> SavePlannerOptionsFromC(
    const dcp_save_planner_options_t* options, bool require_full_coverage);
absl::StatusOr<DefaultLoadPlannerOptions> LoadPlannerOptionsFromC(
    const dcp_load_planner_options_t* options);
absl::StatusOr<comm::ProcessGroupOptions> ProcessGroupOptionsFromC(
    const dcp_process_group_options_t* options);
absl::StatusOr<DeviceWait> DeviceWaitFromC(const dcp_device_wait_t& wait);

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_OPTIONS_H_
