// The C ABI's process groups (dcp_process_group_*): creating one from the
// environment or over the caller's store, its rank and size, the default
// group, and freeing one no save or load is using.
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "capi/internal/group_pin.h"
#include "capi/internal/handles.h"
#include "capi/internal/last_error.h"
#include "capi/internal/options.h"
#include "capi/internal/registry.h"
#include "capi/internal/store_adapter.h"
#include "comm/process_group.h"
#include "comm/process_group_factory.h"
#include "core/status.h"
#include "dcp/dcp.h"
#include "engine/checkpoint.h"

namespace dcp::capi {
namespace {

// A new group handle for `group` in *out.
absl::Status PublishGroup(
    absl::StatusOr<std::unique_ptr<comm::ProcessGroup>> group,
    dcp_process_group_t** out) {
  if (!group.ok()) return group.status();
  auto handle = std::make_unique<dcp_process_group>();
  handle->group = *std::move(group);
  *out = Publish(handle.release());
  return absl::OkStatus();
}

}  // namespace
}  // namespace dcp::capi

using dcp::capi::CheckOut;
using dcp::capi::Guard;
using dcp::capi::Resolve;

extern "C" {

int dcp_process_group_create_from_env(
    const dcp_process_group_options_t* options, dcp_process_group_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_process_group_t**"));
    DCP_ASSIGN_OR_RETURN(dcp::comm::ProcessGroupOptions group_options,
                         dcp::capi::ProcessGroupOptionsFromC(options));
    return dcp::capi::PublishGroup(
        dcp::comm::CreateProcessGroupFromEnvironment(group_options), out);
  });
}

int dcp_process_group_create_from_store(
    const dcp_store_t* store, int32_t rank, int32_t size,
    const dcp_process_group_options_t* options, dcp_process_group_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_process_group_t**"));
    return dcp::capi::PublishGroup(
        dcp::capi::CreateGroupOverStore(store, rank, size, options), out);
  });
}

int dcp_process_group_rank(const dcp_process_group_t* group, int32_t* rank) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(rank, "int32_t* rank"));
    DCP_ASSIGN_OR_RETURN(dcp_process_group * h, Resolve(group));
    *rank = h->group->rank();
    return absl::OkStatus();
  });
}

int dcp_process_group_size(const dcp_process_group_t* group, int32_t* size) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(size, "int32_t* size"));
    DCP_ASSIGN_OR_RETURN(dcp_process_group * h, Resolve(group));
    *size = h->group->size();
    return absl::OkStatus();
  });
}

int dcp_process_group_agree(dcp_process_group_t* group, const char* what,
                            int code, const char* message) {
  return Guard([&]() -> absl::Status {
    if (code < 0 ||
        code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dcp_process_group_agree: code ", code, " is not a dcp_status_t"));
    }
    dcp::comm::ProcessGroup* resolved = nullptr;
    if (group != nullptr) {
      DCP_ASSIGN_OR_RETURN(dcp_process_group * h, Resolve(group));
      resolved = h->group.get();
    } else {
      resolved = dcp::DefaultProcessGroup();
    }
    const absl::Status local =
        code == 0 ? absl::OkStatus()
                  : absl::Status(static_cast<absl::StatusCode>(code),
                                 message != nullptr ? message : "");
    return dcp::AgreeInTurn(resolved, what != nullptr ? what : "agreement",
                            local);
  });
}

int dcp_set_default_process_group(dcp_process_group_t* group) {
  return Guard([&] { return dcp::capi::SetDefaultGroup(group); });
}

int dcp_process_group_free(dcp_process_group_t* group) {
  return Guard([&]() -> absl::Status {
    if (group == nullptr) return absl::OkStatus();
    DCP_RETURN_IF_ERROR(dcp::capi::UnregisterGroup(group));
    delete group;
    return absl::OkStatus();
  });
}

}  // extern "C"
