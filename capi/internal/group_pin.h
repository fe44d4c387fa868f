// The process groups the C ABI's saves and loads run on: the library's
// default group (dcp_set_default_process_group) and pins that keep a group
// from being freed while a save or load uses it.
//
// Thread safety: every function is thread-safe; one lock guards the default
// group and every dcp_process_group::users count.
#ifndef DCP_CAPI_INTERNAL_GROUP_PIN_H_
#define DCP_CAPI_INTERNAL_GROUP_PIN_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capi/internal/handles.h"
#include "comm/process_group.h"
#include "dcp/dcp.h"

namespace dcp::capi {

// The group a save or load uses, pinned for the pin's life.
class GroupPin {
 public:
  GroupPin() = default;
  // `group` must already be counted in its users (PinGroup does that).
  explicit GroupPin(dcp_process_group* group) : group_(group) {}
  GroupPin(GroupPin&& other) : group_(std::exchange(other.group_, nullptr)) {}
  GroupPin& operator=(GroupPin&& other) {
    if (this != &other) {
      Release();
      group_ = std::exchange(other.group_, nullptr);
    }
    return *this;
  }
  ~GroupPin() { Release(); }

  // nullptr: single-process.
  comm::ProcessGroup* get() const {
    return group_ == nullptr ? nullptr : group_->group.get();
  }

 private:
  void Release();

  dcp_process_group* group_ = nullptr;
};

// The group a call uses: `requested`, else the default one, none with
// no_dist. kInvalidArgument when `requested` is not a live group handle.
absl::StatusOr<GroupPin> PinGroup(dcp_process_group_t* requested, bool no_dist);

// Makes `group` (NULL: none) the default group of the C ABI and of the
// engine (SetDefaultProcessGroup). kInvalidArgument when `group` is not a
// live group handle.
absl::Status SetDefaultGroup(dcp_process_group_t* group);

// Forgets the live group handle `group`; the caller deletes it then.
// kFailedPrecondition when it is the default group or a save or load is
// using it; kInvalidArgument when it is not a live group handle.
absl::Status UnregisterGroup(dcp_process_group_t* group);

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_GROUP_PIN_H_
