#include "capi/internal/group_pin.h"

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "capi/internal/registry.h"
#include "core/status.h"
#include "engine/checkpoint.h"

namespace dcp::capi {
namespace {

// Guards dcp_process_group::users and default_group: a group is pinned
// while a save or load uses it, and cannot be freed then.
ABSL_CONST_INIT absl::Mutex group_mu(absl::kConstInit);
dcp_process_group* default_group ABSL_GUARDED_BY(group_mu) = nullptr;

}  // namespace

void GroupPin::Release() {
  if (group_ == nullptr) return;
  absl::MutexLock lock(&group_mu);
  --group_->users;
  group_ = nullptr;
}

absl::StatusOr<GroupPin> PinGroup(dcp_process_group_t* requested,
                                  bool no_dist) {
  if (no_dist) return GroupPin();
  absl::MutexLock lock(&group_mu);
  dcp_process_group* group = default_group;
  if (requested != nullptr) {
    DCP_ASSIGN_OR_RETURN(group, Resolve(requested));
  }
  if (group == nullptr) return GroupPin();
  ++group->users;
  return GroupPin(group);
}

absl::Status SetDefaultGroup(dcp_process_group_t* group) {
  absl::MutexLock lock(&group_mu);
  dcp_process_group* h = nullptr;
  if (group != nullptr) {
    DCP_ASSIGN_OR_RETURN(h, Resolve(group));
  }
  default_group = h;
  SetDefaultProcessGroup(h == nullptr ? nullptr : h->group.get());
  return absl::OkStatus();
}

absl::Status UnregisterGroup(dcp_process_group_t* group) {
  absl::MutexLock lock(&group_mu);
  DCP_ASSIGN_OR_RETURN(dcp_process_group * h, Resolve(group));
  if (default_group == h) {
    return absl::FailedPreconditionError(
        "the process group is the default group; call "
        "dcp_set_default_process_group(NULL) before freeing it");
  }
  if (h->users > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the process group is in use by ", h->users,
        " save(s) or load(s) in flight; wait for them (dcp_shutdown() "
        "waits for every async save) before freeing it"));
  }
  return UnregisterHandle(group, dcp_process_group::kType);
}

}  // namespace dcp::capi
