#include "comm/process_group_factory.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/gloo_process_group.h"
#include "comm/nccl_process_group.h"
#include "core/status.h"

namespace dcp::comm {
namespace {

GroupMembership Membership(const RendezvousInfo& info,
                           const ProcessGroupOptions& options) {
  GroupMembership m;
  m.rank = info.rank;
  m.world_size = info.world_size;
  if (info.store.has_value()) m.store = *info.store;
  m.group_name = options.group_name;
  m.job_id = info.job_id;
  m.timeout = options.timeout;
  m.connect_timeout = options.connect_timeout;
  return m;
}

}  // namespace

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "auto") return Backend::kAuto;
  if (lower == "local") return Backend::kLocal;
  if (lower == "gloo") return Backend::kGloo;
  if (lower == "nccl") return Backend::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown process group backend \"", name,
                   "\": use auto, local, gloo or nccl"));
}

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kLocal:
      return "local";
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateProcessGroup(
    const RendezvousInfo& info, const ProcessGroupOptions& options) {
  Backend backend = options.backend;
  if (backend == Backend::kAuto) {
    backend = info.world_size == 1 ? Backend::kLocal : Backend::kGloo;
  }
  if (backend != Backend::kLocal && info.world_size > 1 &&
      !info.store.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s process group of %d ranks needs a rendezvous (DCP_RENDEZVOUS)",
        BackendName(backend), info.world_size));
  }
  switch (backend) {
    case Backend::kLocal:
      if (info.world_size != 1) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the local process group has one rank, but the world has %d "
            "(from %s); use gloo or nccl",
            info.world_size, info.rank_source));
      }
      return std::unique_ptr<ProcessGroup>(
          new LocalProcessGroup(options.timeout));
    case Backend::kGloo: {
      GlooOptions gloo;
      static_cast<GroupMembership&>(gloo) = Membership(info, options);
      gloo.listen_address = info.listen_address;
      gloo.listen_interface = info.listen_interface;
      DCP_ASSIGN_OR_RETURN(std::unique_ptr<GlooProcessGroup> group,
                           GlooProcessGroup::Create(gloo));
      return std::unique_ptr<ProcessGroup>(std::move(group));
    }
    case Backend::kNccl: {
      NcclOptions nccl;
      static_cast<GroupMembership&>(nccl) = Membership(info, options);
      // The NCCL group does not read job_id: keep jobs apart by the name.
      if (!nccl.job_id.empty()) {
        nccl.group_name = absl::StrCat(nccl.group_name, "/job-", nccl.job_id);
      }
      nccl.cuda_device = options.cuda_device >= 0 ? options.cuda_device
                         : info.local_rank >= 0   ? info.local_rank
                                                  : 0;
      DCP_ASSIGN_OR_RETURN(std::unique_ptr<NcclProcessGroup> group,
                           NcclProcessGroup::Create(nccl));
      return std::unique_ptr<ProcessGroup>(std::move(group));
    }
    case Backend::kAuto:
      break;
  }
  return absl::InternalError("unreachable backend choice");
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateProcessGroupFromEnvironment(
    ProcessGroupOptions options, const EnvLookup& env) {
  if (std::optional<std::string> name = env("DCP_COMM_BACKEND");
      name.has_value() && !name->empty()) {
    absl::StatusOr<Backend> backend = ParseBackend(*name);
    if (!backend.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("DCP_COMM_BACKEND: ", backend.status().message()));
    }
    options.backend = *backend;
  }
  DCP_ASSIGN_OR_RETURN(RendezvousInfo info, RendezvousFromEnvironment(env));
  return CreateProcessGroup(info, options);
}

}  // namespace dcp::comm
