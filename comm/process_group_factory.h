// CreateProcessGroup: picks and starts the ProcessGroup for this process
// from the rendezvous information (usually read from the environment, see
// rendezvous.h).
//
// Backend choice (ProcessGroupOptions::backend, or DCP_COMM_BACKEND=
// auto|local|gloo|nccl for CreateProcessGroupFromEnvironment):
// - kAuto: a world of one rank gets LocalProcessGroup; otherwise Gloo.
//   Coordination payloads (plans, write results, statuses) are host bytes,
//   so Gloo moves them without device copies and needs no GPU per rank;
//   NCCL is used only when asked for.
// - kLocal: only for a world of one rank (kInvalidArgument otherwise).
// - kGloo / kNccl: that backend or an error; never a silent fallback.
#ifndef DCP_COMM_PROCESS_GROUP_FACTORY_H_
#define DCP_COMM_PROCESS_GROUP_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "comm/rendezvous.h"

namespace dcp::comm {

enum class Backend { kAuto, kLocal, kGloo, kNccl };

// "auto", "local", "gloo", "nccl" (case-insensitive); kInvalidArgument
// otherwise.
absl::StatusOr<Backend> ParseBackend(absl::string_view name);
absl::string_view BackendName(Backend backend);

struct ProcessGroupOptions {
  Backend backend = Backend::kAuto;
  // Keeps this group's rendezvous keys apart from other groups'. Use a
  // distinct name for each concurrent group in a job.
  std::string group_name = "dcp-checkpoint";
  // Default timeout of each collective.
  absl::Duration timeout = absl::Minutes(5);
  // How long creation waits for all ranks to join.
  absl::Duration connect_timeout = absl::Minutes(5);
  // NCCL: the CUDA device of this rank; -1 means the local rank (or 0).
  int cuda_device = -1;
};

// Creates and connects the group; blocks until all ranks joined (see
// GlooProcessGroup::Create and NcclProcessGroup::Create for errors).
absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateProcessGroup(
    const RendezvousInfo& info, const ProcessGroupOptions& options);

// RendezvousFromEnvironment + CreateProcessGroup; DCP_COMM_BACKEND, when
// set, overrides options.backend.
absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateProcessGroupFromEnvironment(
    ProcessGroupOptions options = {},
    const EnvLookup& env = ProcessEnvironment());

}  // namespace dcp::comm

#endif  // DCP_COMM_PROCESS_GROUP_FACTORY_H_
