// The calling thread's last error for the C ABI (dcp_last_error_*), and the
// guard every entry point runs its body in: a C++ exception never crosses
// the boundary, and a failing call records what failed.
//
// Thread safety: the last error is thread-local; every function is safe
// from any thread.
#ifndef DCP_CAPI_INTERNAL_LAST_ERROR_H_
#define DCP_CAPI_INTERNAL_LAST_ERROR_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace dcp::capi {

// Records `status` as this thread's last error, with the per-rank failures
// a CheckpointException Status carries (core/checkpoint_exception.h), and
// returns its code. OK records nothing and returns 0 (DCP_OK).
int RecordStatus(const absl::Status& status) noexcept;

// Records the exception being handled (call it in a catch block):
// std::bad_alloc and std::length_error -> kResourceExhausted, any other ->
// kInternal with its what(). Returns the code.
int RecordCurrentException() noexcept;

// True in a child of fork(2) of a process that had called into the C ABI:
// the library's threads (copy pools, async uploads, reapers) stayed in the
// parent, and work handed to them would never run.
bool ForkedAfterUse() noexcept;
// Marks the C ABI as used by this process.
void NoteUse() noexcept;
// Records kFailedPrecondition saying ForkedAfterUse; returns its code.
int RecordForkedChild() noexcept;

// Runs `body` (returning absl::Status) and returns its code, recording a
// failure or a thrown exception as the last error. In a child of fork(2)
// after use, runs nothing and fails (RecordForkedChild).
template <typename Body>
int Guard(Body&& body) noexcept {
  if (ForkedAfterUse()) return RecordForkedChild();
  NoteUse();
  try {
    return RecordStatus(body());
  } catch (...) {
    return RecordCurrentException();
  }
}

int LastErrorCode() noexcept;
const char* LastErrorMessage() noexcept;
size_t LastErrorNumRankFailures() noexcept;
// False when `index` is out of range. `message` stays valid until the next
// failing call on this thread.
bool LastErrorRankFailure(size_t index, int32_t& rank, int& code,
                          const char*& message) noexcept;

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_LAST_ERROR_H_
