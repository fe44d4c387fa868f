// NcclProcessGroup: the ProcessGroup over NCCL for GPU jobs. Payloads go
// host -> device buffer -> NCCL -> device buffer -> host on a stream of the
// group's own, on a communicator of the group's own (never the training
// loop's, so a background save cannot deadlock the loop's collectives).
// No CUDA or NCCL types in this header; NCCL is loaded with dlopen at
// Create (see internal/nccl_library.h), so binaries run without it.
//
// Rendezvous: the ranks join a fresh generation under
// "<group_name>/<instance>/nccl" in the store (Gloo's FileStore or
// RedisStore; JoinGeneration in store_process_group.h), rank 0 makes the
// ncclUniqueId and publishes it under "<generation>/unique_id", and the
// other ranks read it there, so keys a crashed job left are never read.
// Then each rank selects its device and joins the communicator
// (non-blocking init, bounded by connect_timeout). Once rank 0's
// communicator has formed, every rank has read the id: rank 0 removes it
// and the generation's ready key, and the store is left as it was found.
// A creation that fails leaves it so too once every rank has failed
// (LeaveFailedGeneration in store_process_group.h; best effort).
// All device work goes through the DeviceRuntime (cuda/device_runtime.h).
//
// Variable payload sizes: sizes travel first (all-gather or broadcast of
// 8-byte counts), then the bytes: all-gather pads to the largest payload;
// gather and scatter use grouped ncclSend/ncclRecv; broadcast sends the
// size then the bytes.
//
// Timeouts: the host polls the stream and ncclCommGetAsyncError until the
// deadline; past it the communicator is aborted (ncclCommAbort) and the call
// returns kDeadlineExceeded. NCCL does not say which peer is missing, so the
// message names the operation and the group, not a rank; an NCCL error
// (for example a peer's closed socket) gives kUnavailable with NCCL's text.
// NCCL needs one GPU per rank: ranks sharing a GPU fail at Create.
#ifndef DCP_COMM_NCCL_PROCESS_GROUP_H_
#define DCP_COMM_NCCL_PROCESS_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "comm/rendezvous.h"
#include "cuda/device_runtime.h"

namespace dcp::comm {
namespace internal {
struct NcclLibrary;  // comm/internal/nccl_library.h
}  // namespace internal

// `store` is where rank 0 publishes the unique id; `connect_timeout` also
// bounds the communicator's initialization.
struct NcclOptions : GroupMembership {
  // The CUDA device this rank uses.
  int cuda_device = 0;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Joins the group. kUnavailable when NCCL cannot be loaded or the
  // communicator fails to form; kFailedPrecondition when this machine has
  // no usable GPU (no driver, no device, or `cuda_device` out of range);
  // kDeadlineExceeded when rank 0's id or the other ranks do not arrive
  // within connect_timeout; kInvalidArgument for bad rank/size.
  static absl::StatusOr<std::unique_ptr<NcclProcessGroup>> Create(
      const NcclOptions& options);

  // Makes the device runtime the group uses (after the unique id exchange;
  // an error is reported as kFailedPrecondition, "no usable GPU").
  using RuntimeMaker =
      std::function<absl::StatusOr<std::unique_ptr<DeviceRuntime>>()>;

  // Create with the NCCL entry points and the device runtime given: Create
  // passes the dlopened NCCL and the CUDA runtime; tests pass a fake NCCL
  // and the host runtime, which runs every path here without a GPU.
  // `nccl` must outlive the group. Same errors as Create.
  static absl::StatusOr<std::unique_ptr<NcclProcessGroup>> CreateWith(
      const NcclOptions& options, const internal::NcclLibrary& nccl,
      const RuntimeMaker& make_runtime);

  // Releases the communicator (ncclCommAbort: never blocks on a lost peer;
  // every call already waited for its own work).
  ~NcclProcessGroup() override;

  absl::string_view backend() const override { return "nccl"; }

 protected:
  absl::StatusOr<std::vector<std::string>> DoGather(
      absl::string_view payload, int root, absl::Time deadline) override;
  absl::StatusOr<std::string> DoScatter(absl::Span<const std::string> payloads,
                                        int root, absl::Time deadline) override;
  absl::StatusOr<std::string> DoBroadcast(absl::string_view payload, int root,
                                          absl::Time deadline) override;
  absl::StatusOr<std::vector<std::string>> DoAllGather(
      absl::string_view payload, absl::Time deadline) override;
  absl::Status DoBarrier(absl::Time deadline) override;

 private:
  class Impl;
  NcclProcessGroup(int rank, int size, absl::Duration timeout,
                   std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace dcp::comm

#endif  // DCP_COMM_NCCL_PROCESS_GROUP_H_
