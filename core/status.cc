#include "core/status.h"

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace dcp {

absl::Status ErrnoError(int error_number, absl::string_view context) {
  // ErrnoToStatus appends strerror(error_number) to the context.
  absl::Status status = absl::ErrnoToStatus(error_number, context);
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:  // a file-size limit (RLIMIT_FSIZE, the file system's)
      return absl::ResourceExhaustedError(status.message());
    case EIO:
      return absl::DataLossError(status.message());
    default:
      return status;
  }
}

absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(),
                         absl::StrCat(prefix, ": ", status.message()));
  status.ForEachPayload(
      [&annotated](absl::string_view type_url, const absl::Cord& payload) {
        annotated.SetPayload(type_url, payload);
      });
  return annotated;
}

}  // namespace dcp
