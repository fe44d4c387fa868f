// The registry of live C ABI handles. Every handle the library hands out is
// registered with its type until it is freed, so a call can tell a live
// handle of the right type from NULL, a freed handle, a handle of another
// type or any other pointer without dereferencing it: the C ABI's promise
// that a bad handle is DCP_INVALID_ARGUMENT, never a crash.
//
// Handles are structs whose first member is a HandleTag and which name
// their type as `static constexpr HandleType kType`. The tag is a second
// check on memory the registry vouched for.
//
// Thread safety: every function is thread-safe. The registry cannot stop
// one thread from freeing a handle while another uses it; the C ABI leaves
// that to the caller (one call on a handle at a time while it is freed).
#ifndef DCP_CAPI_INTERNAL_REGISTRY_H_
#define DCP_CAPI_INTERNAL_REGISTRY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace dcp::capi {

enum class HandleType : uint32_t {
  kStateDict = 1,
  kMetadata,
  kStorageWriter,
  kStorageReader,
  kProcessGroup,
  kAsyncSave,
  kStager,
  kHostSnapshot,
};

// The C type name, "dcp_state_dict_t", for messages.
const char* HandleTypeName(HandleType type);

inline constexpr uint64_t kHandleMagic = 0x64637068616e646cULL;  // "dcphandl"

struct HandleTag {
  explicit HandleTag(HandleType type_in) : type(type_in) {}
  ~HandleTag() { magic = 0; }
  uint64_t magic = kHandleMagic;
  HandleType type;
};

// Records `handle` as a live handle of `type`.
void RegisterHandle(const void* handle, HandleType type);

// OK when `handle` is a live handle of `type`. kInvalidArgument naming the
// expected type otherwise: NULL, not a live handle, or a handle of another
// type (named too).
absl::Status CheckHandle(const void* handle, HandleType type);

// CheckHandle, then forgets the handle. The caller deletes it.
absl::Status UnregisterHandle(const void* handle, HandleType type);

// The live handle `handle` of type H (const dropped: C passes const handles
// for read-only calls, the library keeps caches in them).
template <typename H>
absl::StatusOr<H*> Resolve(const H* handle) {
  absl::Status status = CheckHandle(handle, H::kType);
  if (!status.ok()) return status;
  H* live = const_cast<H*>(handle);
  if (live->tag.magic != kHandleMagic || live->tag.type != H::kType) {
    return absl::InternalError(
        absl::StrCat(HandleTypeName(H::kType), " handle ",
                     absl::Hex(reinterpret_cast<uintptr_t>(handle)),
                     " is registered but its memory was overwritten"));
  }
  return live;
}

// Registers a new handle and returns it.
template <typename H>
H* Publish(H* handle) {
  RegisterHandle(handle, H::kType);
  return handle;
}

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_REGISTRY_H_
