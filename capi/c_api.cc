// The C ABI of dcp (dcp/dcp.h) over the C++ engine: the library's version,
// status code names, the last error and dtype names. The other entry points
// are in c_api_*.cc, one file per handle kind. Every entry point that can
// fail runs its body in Guard (capi/internal/last_error.h): handles are
// checked against the registry, failures become the thread's last error,
// and no exception leaves the library.
#include <iterator>

#include "absl/status/status.h"
#include "capi/internal/last_error.h"
#include "core/dtype.h"
#include "dcp/dcp.h"

namespace dcp::capi {
namespace {

static_assert(static_cast<int>(DType::kC128) == DCP_DTYPE_C128 &&
                  static_cast<int>(DType::kF8E4M3) == DCP_DTYPE_F8_E4M3 &&
                  static_cast<int>(DType::kF8E8M0) == DCP_DTYPE_F8_E8M0 &&
                  static_cast<int>(DType::kF4E2M1X2) == DCP_DTYPE_F4_E2M1_X2 &&
                  kNumDTypes == DCP_DTYPE_C32 + 1,
              "dcp_dtype_t must number dtypes as core/dtype.h does");
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
                  DCP_UNAUTHENTICATED,
              "dcp_status_t must number codes as absl::StatusCode does");

#define DCP_CAPI_STR_(x) #x
#define DCP_CAPI_STR(x) DCP_CAPI_STR_(x)
constexpr char kVersion[] = DCP_CAPI_STR(DCP_VERSION_MAJOR) "." DCP_CAPI_STR(
    DCP_VERSION_MINOR) "." DCP_CAPI_STR(DCP_VERSION_PATCH);

}  // namespace
}  // namespace dcp::capi

extern "C" {

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

}  // extern "C"
