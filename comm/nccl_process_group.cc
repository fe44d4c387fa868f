#include "comm/nccl_process_group.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/internal/gloo_store.h"
#include "comm/internal/nccl_library.h"
#include "comm/internal/payload_limit.h"
#include "comm/store_process_group.h"
#include "core/status.h"

namespace dcp::comm {
namespace {

using internal::NcclLibrary;

// Device memory that grows on demand and is freed with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void Bind(DeviceRuntime* runtime, int device) {
    runtime_ = runtime;
    device_ = device;
  }

  // Makes room for `bytes` (contents are not kept).
  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return absl::OkStatus();
    Release();
    const size_t want = std::max<size_t>(bytes, 4096);
    absl::StatusOr<void*> ptr = runtime_->AllocateDevice(device_, want);
    if (!ptr.ok()) {
      return Annotate(
          ptr.status(),
          absl::StrCat("device memory for NCCL payloads (", want, " bytes)"));
    }
    ptr_ = *ptr;
    capacity_ = want;
    return absl::OkStatus();
  }
  char* data() const { return static_cast<char*>(ptr_); }

  // Frees the memory now.
  void Release() {
    if (ptr_ != nullptr) runtime_->FreeDevice(ptr_).IgnoreError();
    ptr_ = nullptr;
    capacity_ = 0;
  }

 private:
  DeviceRuntime* runtime_ = nullptr;
  int device_ = 0;
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};

// Makes `device` current on the calling thread for a scope: collectives may
// run on any thread (a background save thread), and the current device is
// per thread.
class DeviceScope {
 public:
  // Gives the previous device back only where SetCurrentDevice says to.
  DeviceScope(DeviceRuntime* runtime, int device) : runtime_(runtime) {
    if (runtime_ == nullptr) return;
    absl::StatusOr<int> previous = runtime_->SetCurrentDevice(device);
    previous_ = previous.ok() && *previous != device ? *previous : -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0) runtime_->SetCurrentDevice(previous_).IgnoreError();
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  DeviceRuntime* const runtime_;
  int previous_ = -1;
};

}  // namespace

class NcclProcessGroup::Impl {
 public:
  Impl(const NcclLibrary* nccl, int rank, int size, uint64_t max_payload)
      : nccl_(nccl),
        rank_(rank),
        size_(size),
        max_payload_(internal::MaxPayloadBytes(max_payload)) {}

  // Every call waited for its work, so aborting cuts nothing short, and
  // unlike a destroy it cannot block on a lost peer. The device work is
  // released on the group's device, before the runtime goes.
  ~Impl() {
    if (runtime_ == nullptr) {
      if (comm_ != nullptr) nccl_->CommAbort(comm_);
      return;
    }
    DeviceScope scope(runtime_.get(), device_);
    if (comm_ != nullptr) nccl_->CommAbort(comm_);
    for (DeviceBuffer* buffer : {&sizes_, &send_, &recv_}) buffer->Release();
    done_.Reset();
    stream_.Reset();
  }

  absl::Status Init(const NcclOptions& options,
                    const RuntimeMaker& make_runtime) {
    absl::Status status = JoinCommunicator(options, make_runtime);
    if (!status.ok() && keys_ != nullptr && !generation_.empty()) {
      // Best effort: the last rank to fail removes the unique id and the
      // generation's ready key (a failed join removed its own keys).
      LeaveFailedGeneration(*keys_, base_, generation_, rank_, size_,
                            {id_key_});
    }
    return status;
  }

  absl::Status JoinCommunicator(const NcclOptions& options,
                                const RuntimeMaker& make_runtime) {
    const absl::Time deadline = absl::Now() + options.connect_timeout;
    DCP_ASSIGN_OR_RETURN(std::string id, ExchangeId(options, deadline));

    absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime = make_runtime();
    if (!runtime.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "nccl process group, rank %d of %d: no usable GPU (%s); NCCL needs "
          "one GPU per rank: use the gloo backend on this machine",
          rank_, size_, runtime.status().message()));
    }
    runtime_ = *std::move(runtime);
    const int devices = runtime_->DeviceCount();
    if (options.cuda_device < 0 || options.cuda_device >= devices) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "nccl process group, rank %d of %d: CUDA device %d does not exist "
          "(this machine has %d); NCCL needs one GPU per rank",
          rank_, size_, options.cuda_device, devices));
    }
    device_ = options.cuda_device;
    for (DeviceBuffer* buffer : {&sizes_, &send_, &recv_}) {
      buffer->Bind(runtime_.get(), device_);
    }
    // ncclCommInitRank joins on the current device; the caller's comes
    // back after.
    DeviceScope scope(runtime_.get(), device_);
    DCP_RETURN_IF_ERROR(runtime_->SetCurrentDevice(device_).status());
    DCP_ASSIGN_OR_RETURN(stream_, MakeOwnedStream(*runtime_, device_));
    DCP_ASSIGN_OR_RETURN(done_, MakeOwnedEvent(*runtime_, device_,
                                               /*enable_timing=*/false));

    ncclUniqueId unique_id;
    std::memcpy(unique_id.internal, id.data(), sizeof(unique_id.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // Lets the host bound the wait.
    const ncclResult_t rc =
        nccl_->CommInitRankConfig(&comm_, size_, unique_id, rank_, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      return NcclError("ncclCommInitRank", rc);
    }
    DCP_RETURN_IF_ERROR(
        WaitForComm("ncclCommInitRank", deadline, options.connect_timeout));
    // Every rank joined the communicator, so every rank has read the id.
    if (rank_ == 0 && keys_ != nullptr) {
      keys_->Remove(id_key_).IgnoreError();
      ForgetGeneration(*keys_, base_, generation_).IgnoreError();
    }
    keys_.reset();
    store_.reset();
    return absl::OkStatus();
  }

  // Sizes of every rank's payload (one 8-byte count each), all-gathered.
  absl::StatusOr<std::vector<uint64_t>> AllGatherSizes(absl::string_view op,
                                                       uint64_t own,
                                                       absl::Time deadline) {
    DCP_RETURN_IF_ERROR(sizes_.Reserve(size_ * sizeof(uint64_t)));
    uint64_t* d_sizes = reinterpret_cast<uint64_t*>(sizes_.data());
    DCP_RETURN_IF_ERROR(ToDevice(d_sizes + rank_, &own, sizeof(own)));
    DCP_RETURN_IF_ERROR(
        Check(op, nccl_->AllGather(d_sizes + rank_, d_sizes, 1, ncclUint64,
                                   comm_, stream())));
    DCP_RETURN_IF_ERROR(Wait(op, deadline));
    std::vector<uint64_t> sizes(size_);
    DCP_RETURN_IF_ERROR(
        ToHost(sizes.data(), d_sizes, size_ * sizeof(uint64_t)));
    return sizes;
  }

  absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view op,
                                                     absl::string_view payload,
                                                     absl::Time deadline) {
    DCP_ASSIGN_OR_RETURN(std::vector<uint64_t> sizes,
                         AllGatherSizes(op, payload.size(), deadline));
    DCP_RETURN_IF_ERROR(CheckSizes(op, sizes, /*from=*/-1, /*all_held=*/true));
    const uint64_t max = *std::max_element(sizes.begin(), sizes.end());
    std::vector<std::string> all(size_);
    if (max == 0) return all;
    DCP_RETURN_IF_ERROR(send_.Reserve(max));
    DCP_RETURN_IF_ERROR(recv_.Reserve(max * size_));
    DCP_RETURN_IF_ERROR(ToDevice(send_.data(), payload.data(), payload.size()));
    DCP_RETURN_IF_ERROR(
        Check(op, nccl_->AllGather(send_.data(), recv_.data(), max, ncclUint8,
                                   comm_, stream())));
    DCP_RETURN_IF_ERROR(Wait(op, deadline));
    for (int r = 0; r < size_; ++r) {
      all[r].resize(sizes[r]);
      DCP_RETURN_IF_ERROR(
          ToHost(all[r].data(), recv_.data() + r * max, sizes[r]));
    }
    return all;
  }

  absl::StatusOr<std::vector<std::string>> Gather(absl::string_view payload,
                                                  int root,
                                                  absl::Time deadline) {
    DCP_ASSIGN_OR_RETURN(std::vector<uint64_t> sizes,
                         AllGatherSizes("gather", payload.size(), deadline));
    DCP_RETURN_IF_ERROR(
        CheckSizes("gather", sizes, /*from=*/-1, /*all_held=*/true));
    std::vector<uint64_t> offsets(size_ + 1, 0);
    for (int r = 0; r < size_; ++r) offsets[r + 1] = offsets[r] + sizes[r];
    if (rank_ == root) {
      DCP_RETURN_IF_ERROR(recv_.Reserve(offsets[size_]));
    } else {
      DCP_RETURN_IF_ERROR(send_.Reserve(payload.size()));
      DCP_RETURN_IF_ERROR(
          ToDevice(send_.data(), payload.data(), payload.size()));
    }
    DCP_RETURN_IF_ERROR(RootExchange("gather", root, /*to_root=*/true, sizes,
                                     offsets, deadline));
    if (rank_ != root) return std::vector<std::string>();
    std::vector<std::string> all(size_);
    for (int r = 0; r < size_; ++r) {
      if (r == root) {
        all[r] = std::string(payload);
        continue;
      }
      all[r].resize(sizes[r]);
      DCP_RETURN_IF_ERROR(
          ToHost(all[r].data(), recv_.data() + offsets[r], sizes[r]));
    }
    return all;
  }

  absl::StatusOr<std::string> Scatter(absl::Span<const std::string> payloads,
                                      int root, absl::Time deadline) {
    // The root's sizes reach every rank first.
    std::vector<uint64_t> sizes(size_, 0);
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) sizes[r] = payloads[r].size();
    }
    DCP_RETURN_IF_ERROR(sizes_.Reserve(size_ * sizeof(uint64_t)));
    DCP_RETURN_IF_ERROR(
        ToDevice(sizes_.data(), sizes.data(), size_ * sizeof(uint64_t)));
    DCP_RETURN_IF_ERROR(
        Check("scatter", nccl_->Broadcast(sizes_.data(), sizes_.data(), size_,
                                          ncclUint64, root, comm_, stream())));
    DCP_RETURN_IF_ERROR(Wait("scatter", deadline));
    DCP_RETURN_IF_ERROR(
        ToHost(sizes.data(), sizes_.data(), size_ * sizeof(uint64_t)));
    DCP_RETURN_IF_ERROR(
        CheckSizes("scatter", sizes, /*from=*/root, /*all_held=*/false));
    std::vector<uint64_t> offsets(size_ + 1, 0);
    for (int r = 0; r < size_; ++r) offsets[r + 1] = offsets[r] + sizes[r];
    if (rank_ == root) {
      DCP_RETURN_IF_ERROR(send_.Reserve(offsets[size_]));
      for (int r = 0; r < size_; ++r) {
        DCP_RETURN_IF_ERROR(
            ToDevice(send_.data() + offsets[r], payloads[r].data(), sizes[r]));
      }
    } else {
      DCP_RETURN_IF_ERROR(recv_.Reserve(sizes[rank_]));
    }
    DCP_RETURN_IF_ERROR(RootExchange("scatter", root, /*to_root=*/false, sizes,
                                     offsets, deadline));
    if (rank_ == root) return payloads[root];
    std::string mine(sizes[rank_], '\0');
    DCP_RETURN_IF_ERROR(ToHost(mine.data(), recv_.data(), mine.size()));
    return mine;
  }

  absl::StatusOr<std::string> Broadcast(absl::string_view payload, int root,
                                        absl::Time deadline) {
    uint64_t size = rank_ == root ? payload.size() : 0;
    DCP_RETURN_IF_ERROR(sizes_.Reserve(sizeof(uint64_t)));
    DCP_RETURN_IF_ERROR(ToDevice(sizes_.data(), &size, sizeof(size)));
    DCP_RETURN_IF_ERROR(Check(
        "broadcast", nccl_->Broadcast(sizes_.data(), sizes_.data(), 1,
                                      ncclUint64, root, comm_, stream())));
    DCP_RETURN_IF_ERROR(Wait("broadcast", deadline));
    DCP_RETURN_IF_ERROR(ToHost(&size, sizes_.data(), sizeof(size)));
    if (size > max_payload_) return OversizedPayload("broadcast", root, size);
    if (rank_ == root) {
      if (size == 0) return std::string();
      DCP_RETURN_IF_ERROR(recv_.Reserve(size));
      DCP_RETURN_IF_ERROR(ToDevice(recv_.data(), payload.data(), size));
    } else {
      if (size == 0) return std::string();
      DCP_RETURN_IF_ERROR(recv_.Reserve(size));
    }
    DCP_RETURN_IF_ERROR(
        Check("broadcast", nccl_->Broadcast(recv_.data(), recv_.data(), size,
                                            ncclUint8, root, comm_, stream())));
    DCP_RETURN_IF_ERROR(Wait("broadcast", deadline));
    if (rank_ == root) return std::string(payload);
    std::string out(size, '\0');
    DCP_RETURN_IF_ERROR(ToHost(out.data(), recv_.data(), size));
    return out;
  }

  absl::Status Barrier(absl::Time deadline) {
    return AllGatherSizes("barrier", 0, deadline).status();
  }

  int device() const { return device_; }
  DeviceRuntime* runtime() const { return runtime_.get(); }

 private:
  // Point-to-point between `root` and every other rank r with sizes[r] > 0
  // bytes: with `to_root`, r sends send_ and root receives into
  // recv_ + offsets[r]; otherwise root sends send_ + offsets[r] and r
  // receives into recv_. Waits for completion.
  absl::Status RootExchange(absl::string_view op, int root, bool to_root,
                            const std::vector<uint64_t>& sizes,
                            const std::vector<uint64_t>& offsets,
                            absl::Time deadline) {
    DCP_RETURN_IF_ERROR(Check(op, nccl_->GroupStart()));
    for (int r = 0; r < size_; ++r) {
      if (r == root || sizes[r] == 0) continue;
      ncclResult_t rc = ncclSuccess;
      if (rank_ == root) {
        rc = to_root ? nccl_->Recv(recv_.data() + offsets[r], sizes[r],
                                   ncclUint8, r, comm_, stream())
                     : nccl_->Send(send_.data() + offsets[r], sizes[r],
                                   ncclUint8, r, comm_, stream());
      } else if (r == rank_) {
        rc = to_root ? nccl_->Send(send_.data(), sizes[r], ncclUint8, root,
                                   comm_, stream())
                     : nccl_->Recv(recv_.data(), sizes[r], ncclUint8, root,
                                   comm_, stream());
      }
      if (rc != ncclSuccess && rc != ncclInProgress) {
        nccl_->GroupEnd();
        return NcclError(op, rc);
      }
    }
    DCP_RETURN_IF_ERROR(Check(op, nccl_->GroupEnd()));
    return Wait(op, deadline);
  }

  // kDataLoss when a payload size is more than a rank accepts
  // (max_payload_), before anything is allocated for it: any one size, or
  // with `all_held` (a rank receives them all at once) their total. sizes[r]
  // came from rank r, or every one from rank `from` when it is not -1.
  // Every rank of the collective holds the same sizes and checks all of
  // them, its own too, so either every rank fails here or none does (none
  // is left waiting in the collective for a rank that refused it).
  absl::Status CheckSizes(absl::string_view op,
                          const std::vector<uint64_t>& sizes, int from,
                          bool all_held) const {
    uint64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      if (sizes[r] > max_payload_) {
        return OversizedPayload(op, from < 0 ? r : from, sizes[r]);
      }
      if (!all_held) continue;
      total += sizes[r];  // No overflow: each is at most max_payload_.
      if (total > max_payload_) {
        return absl::DataLossError(absl::StrFormat(
            "%s on rank %d of %d: the ranks announced payloads of %d bytes "
            "in all, more than the %d a rank accepts (max_payload_bytes, by "
            "default this machine's physical memory); a size is corrupt",
            op, rank_, size_, total, max_payload_));
      }
    }
    return absl::OkStatus();
  }

  absl::Status OversizedPayload(absl::string_view op, int peer,
                                uint64_t size) const {
    return absl::DataLossError(absl::StrFormat(
        "%s on rank %d of %d: rank %d announced a payload of %d bytes, more "
        "than the %d this rank accepts (max_payload_bytes, by default this "
        "machine's physical memory); the size is corrupt",
        op, rank_, size_, peer, size, max_payload_));
  }

  // A fresh unique id as bytes.
  absl::StatusOr<std::string> NewId() const {
    ncclUniqueId id;
    const ncclResult_t rc = nccl_->GetUniqueId(&id);
    if (rc != ncclSuccess) {
      return absl::UnavailableError(
          absl::StrCat("ncclGetUniqueId: ", nccl_->GetErrorString(rc)));
    }
    return std::string(id.internal, sizeof(id.internal));
  }

  // The ranks join a fresh generation under "<group>/<instance>/nccl" (so
  // keys a crashed job left are never read); rank 0 makes the id and
  // publishes it under "<generation>/unique_id"; the others wait for it.
  // The store stays open until Init removes the keys.
  absl::StatusOr<std::string> ExchangeId(const NcclOptions& options,
                                         absl::Time deadline) {
    if (size_ == 1) return NewId();
    // Numbered before anything can fail (as the Gloo group's).
    base_ = absl::StrCat(options.group_name, "/",
                         internal::NextInstance(options.group_name, rank_),
                         "/nccl");
    DCP_ASSIGN_OR_RETURN(store_, internal::OpenStore(options.store));
    keys_ = internal::AsKeyValueStore(*store_);
    const std::string where =
        absl::StrFormat("nccl process group, rank %d of %d, under \"%s\" in %s",
                        rank_, size_, base_, options.store.ToString());
    absl::StatusOr<std::string> generation =
        JoinGeneration(*keys_, base_, rank_, size_, deadline);
    if (!generation.ok()) return Annotate(generation.status(), where);
    generation_ = *generation;
    id_key_ = absl::StrCat(base_, "/", generation_, "/unique_id");
    if (rank_ == 0) {
      DCP_ASSIGN_OR_RETURN(std::string id, NewId());
      DCP_RETURN_IF_ERROR(Annotate(keys_->Set(id_key_, id), where));
      return id;
    }
    absl::StatusOr<std::string> id = keys_->Get(
        id_key_, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (absl::IsDeadlineExceeded(id.status())) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s: no unique id from rank 0 within %s (is rank 0 running?): %s",
          where, absl::FormatDuration(options.connect_timeout),
          id.status().message()));
    }
    if (!id.ok()) return Annotate(id.status(), where);
    if (id->size() != sizeof(ncclUniqueId::internal)) {
      return absl::DataLossError(
          absl::StrFormat("%s: the unique id is %d bytes, expected %d", where,
                          id->size(), sizeof(ncclUniqueId::internal)));
    }
    return *std::move(id);
  }

  absl::Status NcclError(absl::string_view op, ncclResult_t rc) {
    const char* last = comm_ != nullptr ? nccl_->GetLastError(comm_) : "";
    if (last == nullptr) last = "";
    return absl::UnavailableError(absl::StrFormat(
        "%s on rank %d of %d: NCCL error: %s%s%s (a peer may be lost)", op,
        rank_, size_, nccl_->GetErrorString(rc), *last ? ": " : "", last));
  }

  absl::Status Check(absl::string_view op, ncclResult_t rc) {
    if (rc == ncclSuccess || rc == ncclInProgress) return absl::OkStatus();
    return NcclError(op, rc);
  }

  // Waits until the communicator finished initializing.
  absl::Status WaitForComm(absl::string_view op, absl::Time deadline,
                           absl::Duration limit) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      nccl_->CommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return NcclError(op, state);
      if (absl::Now() >= deadline) return Abort(op, limit);
      absl::SleepFor(absl::Microseconds(500));
    }
  }

  // Waits until the NCCL call just made (a collective, or ncclGroupEnd)
  // is on the stream. On a non-blocking communicator it may have returned
  // ncclInProgress: NCCL enqueues the work later, and reports ncclSuccess
  // from ncclCommGetAsyncError once it has (no NCCL call and no stream
  // work may come before). Past the deadline, aborts the communicator.
  absl::Status WaitEnqueued(absl::string_view op, absl::Time deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = nccl_->CommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) return NcclError(op, rc);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return NcclError(op, state);
      if (absl::Now() >= deadline) {
        return Abort(absl::StrCat(op, " (NCCL had not enqueued it)"),
                     absl::ZeroDuration());
      }
      absl::SleepFor(absl::Microseconds(200));
    }
  }

  // Waits until the NCCL call just made is enqueued (WaitEnqueued), then
  // until the work queued on the stream completed.
  absl::Status Wait(absl::string_view op, absl::Time deadline) {
    DCP_RETURN_IF_ERROR(WaitEnqueued(op, deadline));
    DCP_RETURN_IF_ERROR(
        Annotate(runtime_->RecordEvent(done_.get(), stream_.get()),
                 absl::StrCat(op, ": stream")));
    for (;;) {
      ncclResult_t state = ncclSuccess;
      nccl_->CommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclError(op, state);
      }
      if (state == ncclSuccess) {
        absl::StatusOr<bool> done = runtime_->QueryEvent(done_.get());
        if (!done.ok()) {
          return Annotate(done.status(), absl::StrCat(op, ": stream"));
        }
        if (*done) return absl::OkStatus();
      }
      if (absl::Now() >= deadline) return Abort(op, absl::ZeroDuration());
      absl::SleepFor(absl::Microseconds(200));
    }
  }

  absl::Status Abort(absl::string_view op, absl::Duration limit) {
    nccl_->CommAbort(comm_);
    comm_ = nullptr;
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s on rank %d of %d: deadline passed%s; NCCL does not tell which "
        "rank is missing (lost, hung or behind); the communicator was aborted",
        op, rank_, size_,
        limit > absl::ZeroDuration()
            ? absl::StrCat(" after ", absl::FormatDuration(limit))
            : ""));
  }

  // `src` must stay valid until the next Wait: every caller waits before
  // it returns.
  absl::Status ToDevice(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    return Annotate(runtime_->CopyAsync(dst, src, bytes,
                                        CopyKind::kHostToDevice, stream_.get()),
                    "copy to GPU");
  }

  // Called only after Wait, so the copy does not block on pending NCCL work.
  absl::Status ToHost(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    absl::Status s = runtime_->CopyAsync(
        dst, src, bytes, CopyKind::kDeviceToHost, stream_.get());
    if (s.ok()) s = runtime_->SynchronizeStream(stream_.get());
    return Annotate(s, "copy from GPU");
  }

  cudaStream_t stream() const {
    return static_cast<cudaStream_t>(runtime_->NativeStream(stream_.get()));
  }

  const NcclLibrary* const nccl_;
  const int rank_;
  const int size_;
  // The largest payload accepted from a peer (CheckSizes).
  const uint64_t max_payload_;
  int device_ = 0;
  // Declared first among the device members: destroyed after them.
  std::unique_ptr<DeviceRuntime> runtime_;
  OwnedStream stream_;
  OwnedEvent done_;  // Recorded after each call's work; polled by Wait.
  ncclComm_t comm_ = nullptr;
  DeviceBuffer sizes_;
  DeviceBuffer send_;
  DeviceBuffer recv_;
  // The rendezvous, from the id exchange until the communicator formed.
  std::unique_ptr<gloo::rendezvous::Store> store_;
  std::unique_ptr<KeyValueStore> keys_;
  std::string base_;
  std::string generation_;
  std::string id_key_;
};

absl::StatusOr<std::unique_ptr<NcclProcessGroup>> NcclProcessGroup::Create(
    const NcclOptions& options) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("nccl: rank %d outside a world of %d ranks",
                        options.rank, options.world_size));
  }
  DCP_ASSIGN_OR_RETURN(const NcclLibrary* nccl, internal::LoadNccl());
  return CreateWith(options, *nccl, [] {
    return CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
  });
}

absl::StatusOr<std::unique_ptr<NcclProcessGroup>> NcclProcessGroup::CreateWith(
    const NcclOptions& options, const internal::NcclLibrary& nccl,
    const RuntimeMaker& make_runtime) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("nccl: rank %d outside a world of %d ranks",
                        options.rank, options.world_size));
  }
  auto impl = std::make_unique<Impl>(&nccl, options.rank, options.world_size,
                                     options.max_payload_bytes);
  DCP_RETURN_IF_ERROR(impl->Init(options, make_runtime));
  return std::unique_ptr<NcclProcessGroup>(new NcclProcessGroup(
      options.rank, options.world_size, options.timeout, std::move(impl)));
}

NcclProcessGroup::NcclProcessGroup(int rank, int size, absl::Duration timeout,
                                   std::unique_ptr<Impl> impl)
    : ProcessGroup(rank, size, timeout), impl_(std::move(impl)) {}

// Impl's destructor selects the device itself: a scope here would outlive
// the runtime it restores the device with.
NcclProcessGroup::~NcclProcessGroup() { impl_.reset(); }

absl::StatusOr<std::vector<std::string>> NcclProcessGroup::DoGather(
    absl::string_view payload, int root, absl::Time deadline) {
  DeviceScope scope(impl_->runtime(), impl_->device());
  return impl_->Gather(payload, root, deadline);
}

absl::StatusOr<std::string> NcclProcessGroup::DoScatter(
    absl::Span<const std::string> payloads, int root, absl::Time deadline) {
  DeviceScope scope(impl_->runtime(), impl_->device());
  return impl_->Scatter(payloads, root, deadline);
}

absl::StatusOr<std::string> NcclProcessGroup::DoBroadcast(
    absl::string_view payload, int root, absl::Time deadline) {
  DeviceScope scope(impl_->runtime(), impl_->device());
  return impl_->Broadcast(payload, root, deadline);
}

absl::StatusOr<std::vector<std::string>> NcclProcessGroup::DoAllGather(
    absl::string_view payload, absl::Time deadline) {
  DeviceScope scope(impl_->runtime(), impl_->device());
  return impl_->AllGather("allgather", payload, deadline);
}

absl::Status NcclProcessGroup::DoBarrier(absl::Time deadline) {
  DeviceScope scope(impl_->runtime(), impl_->device());
  return impl_->Barrier(deadline);
}

}  // namespace dcp::comm
