// Status helpers shared by every layer: the propagation macros that the
// system abseil (LTS 20220623) lacks, errno conversion with context, and
// annotation of a Status with where it happened.
#ifndef DCP_CORE_STATUS_H_
#define DCP_CORE_STATUS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dcp {

// Returns a Status for `error_number` (an errno value) whose message starts
// with `context` (what was attempted, on which file and offset). ENOSPC,
// EDQUOT and EFBIG map to kResourceExhausted, EIO to kDataLoss; the rest
// follow absl::ErrnoToStatus.
absl::Status ErrnoError(int error_number, absl::string_view context);

// Returns `status` with `prefix` prepended to its message ("prefix: msg"),
// keeping the code and payloads. OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view prefix);

}  // namespace dcp

#define DCP_STATUS_CONCAT_INNER_(a, b) a##b
#define DCP_STATUS_CONCAT_(a, b) DCP_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define DCP_RETURN_IF_ERROR(expr)                            \
  do {                                                       \
    ::absl::Status dcp_status_macro_value_ = (expr);         \
    if (ABSL_PREDICT_FALSE(!dcp_status_macro_value_.ok())) { \
      return dcp_status_macro_value_;                        \
    }                                                        \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its Status when it is not
// OK, otherwise moves the value into `lhs` (a declaration or an lvalue).
#define DCP_ASSIGN_OR_RETURN(lhs, rexpr)                                       \
  DCP_ASSIGN_OR_RETURN_IMPL_(DCP_STATUS_CONCAT_(dcp_statusor_, __LINE__), lhs, \
                             rexpr)

#define DCP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                               \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {              \
    return std::move(statusor).status();                 \
  }                                                      \
  lhs = std::move(statusor).value()

#endif  // DCP_CORE_STATUS_H_
