// Staging a state dict into host memory before it is written: the seed's
// AsyncStager interface, StagingOptions, DefaultStager and a BlockingStager.
//
// A staged state dict is a snapshot: same nesting and keys, every tensor
// (plain or ShardedTensor shard) replaced by a contiguous CPU tensor in
// staging memory owned by the staged dict, every other value copied. Once
// staging is complete the caller may change its tensors freely; the staged
// copy keeps the old bytes. Seed copy semantics:
//   * a tensor reachable under several keys (same memory, dtype, shape and
//     strides) is staged once and every key shares the staged copy;
//   * non-contiguous tensors come out contiguous;
//   * device tensors are copied device-to-host on streams into (optionally
//     pinned, optionally shared) host memory; CPU tensors are memcpy'd by a
//     few threads.
//
// Staging memory: one HostBuffer (staging/host_buffer_pool.h) per staged dict,
// sized to the dict. With cache_staged_state_dict the stager keeps up to
// max_cached_buffers of them and reuses one for the next Stage when it is
// large enough and no staged dict from before still uses it (so two saves in
// flight never share memory).
//
// Thread safety: every method of DefaultStager and BlockingStager may be
// called from any thread. Stagings run one at a time; with
// use_async_staging they run on the stager's background thread in the order
// Stage was called. SynchronizeStaging and Close wait for what was started
// before them. A staged dict is a plain StateDict, owned by the
// caller and not synchronized.
//
// Errors (each method says which of its own): kInvalidArgument for what the
// caller passed (a tensor without data, a device the runtime lacks),
// kResourceExhausted when staging memory cannot be had, the runtime's error
// for a failed copy, kUnimplemented for a device wait a stager cannot honour,
// kFailedPrecondition after Close().
#ifndef DCP_STAGING_STAGER_H_
#define DCP_STAGING_STAGER_H_

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/executor.h"
#include "core/future.h"
#include "core/state_dict.h"
#include "cuda/device_runtime.h"
#include "staging/cow_snapshot.h"
#include "staging/host_buffer_pool.h"

namespace dcp {

namespace internal_staging {
class CopyStreams;
}  // namespace internal_staging

struct StagingOptions {
  // The seed's four switches. Defaults are the seed's DefaultStager defaults
  // (all on); async_save without a stager uses AsyncSaveDefault() (all off).
  bool use_pinned_memory = true;      // Page-lock staging memory.
  bool use_shared_memory = true;      // Staging memory in a memfd.
  bool use_async_staging = true;      // Stage on a background thread.
  bool use_non_blocking_copy = true;  // Return before device copies finish.

  // dcp's knobs.
  // Copy streams per device (see StagingPipelineOptions::num_streams). One:
  // a GPU has one copy engine per direction, so more streams do not stage
  // faster (docs/BENCHMARKS.md section 2).
  int num_streams = 1;
  // Device tensors are copied in pieces of this size, round robin over the
  // streams: large enough that the per-copy cost vanishes
  // (docs/BENCHMARKS.md section 2); larger pieces only delay the first
  // piece's completion.
  size_t copy_chunk_bytes = size_t{64} << 20;
  // Small device tensors that lie close together in one device allocation
  // (as a caching allocator places them) are staged by one copy for all of
  // them, laid out in the staging buffer as on the device, gaps included
  // (see DefaultStager::Plan::CoalesceDeviceCopies): for states of many
  // small tensors a copy's fixed cost, not its bytes, sets the time.
  bool coalesce_device_copies = true;
  // Threads that memcpy CPU tensors (0: min(4, hardware threads)).
  int cpu_copy_threads = 0;
  // Keep the staging memory between Stage calls: the seed's
  // cache_staged_state_dict, an argument of its FileSystemWriter (which
  // stages there); here the stager stages, so it holds the option.
  bool cache_staged_state_dict = true;
  // How many staging buffers the cache keeps. A Stage while the previous
  // staged dict is still in use (its upload is running) needs a second
  // buffer; with 2 that one is kept too, so an AsyncSave issued every step
  // while the last upload finishes maps memory only on its first time
  // (mapping fresh memory costs several times a memcpy of it). A buffer is only
  // made when all cached ones are busy, so saves that never overlap keep
  // one.
  int max_cached_buffers = 2;
  // Unpinned staging memory outlives the stager as the process's spare
  // buffer (HostBufferOptions::recycle), so a stager made per save (as
  // async_save does without a stager) does not map and fault in fresh memory
  // each time. Keeps at most one state-sized buffer per process mapped;
  // ReleaseSpareHostBuffers() unmaps it.
  bool recycle_staging_memory = true;

  // Stage contiguous CPU tensors by a copy-on-write snapshot
  // (staging/cow_snapshot.h) instead of copying them before staging is
  // complete: the sources' pages are write-protected and copied in the
  // background, a write to one before its copy waiting for it. Staging is
  // then complete (StageReleasing's `released`) in the time it takes to
  // protect the pages, and the staged dict (Stage's future) once every byte
  // is copied. The caller may change its tensors once released, but must
  // keep them allocated until the staged dict's future is ready (an
  // AsyncSave: until upload_completion). Writes that bypass the page tables
  // are not seen: never use it for tensors a device writes by DMA
  // (page-locked host memory, RDMA registrations). Without userfaultfd
  // (CowSnapshotsAvailable) the tensors are copied as without the option.
  bool copy_on_write = false;

  // What async_save uses when the caller passes no stager: pageable memory,
  // synchronous staging, blocking copies.
  static StagingOptions AsyncSaveDefault();
};

class AsyncStager {
 public:
  virtual ~AsyncStager() = default;

  // Stages `state_dict` (see the file comment). The caller keeps every tensor
  // of `state_dict` valid and unchanged until the returned future is ready
  // (and, when should_synchronize_after_execute(), until SynchronizeStaging
  // returned). The future is ready on return when staging is synchronous.
  // Errors: kInvalidArgument for a tensor without data or on a device the
  // runtime lacks (naming the key), the runtime's error for a failed copy,
  // kFailedPrecondition after Close().
  virtual Future<StateDict> Stage(const StateDict& state_dict) = 0;

  // Stage, with no device copy starting before the caller's device work
  // `wait` names is done (core/device.h); the host is not blocked for it.
  // Stagers that cannot order their copies (the default) fail a non-empty
  // wait with kUnimplemented rather than copy too early.
  virtual Future<StateDict> Stage(const StateDict& state_dict,
                                  const DeviceWait& wait) {
    if (wait.empty()) return Stage(state_dict);
    return Future<StateDict>::Ready(absl::UnimplementedError(
        "this stager cannot order its device copies after the caller's "
        "stream; use DefaultStager"));
  }

  // Stage, also saying when the caller may change its tensors again:
  // `released` is set with this stage's outcome (its error, if staging
  // fails) once the sources are no longer read: earlier than the returned
  // future when the staged dict fills after the sources were let go
  // (StagingOptions::copy_on_write), later when device copies were left
  // running (DefaultStager with non-blocking copies sets it once this
  // stage's own copies have landed, so the caller needs no
  // SynchronizeStaging for it). Until the returned future is ready the
  // caller keeps its tensors allocated; until `released` also unchanged.
  // The default sets `released` when the future is ready.
  virtual Future<StateDict> StageReleasing(const StateDict& state_dict,
                                           const DeviceWait& wait,
                                           const Promise<void>& released) {
    Future<StateDict> staged = Stage(state_dict, wait);
    staged.OnReady([released](const absl::StatusOr<StateDict>& result) {
      released.Set(result.status());
    });
    return staged;
  }

  // True when the staged dict may still be filling after Stage's future is
  // ready (non-blocking device copies): the caller then calls
  // SynchronizeStaging() before reading it (the seed calls it right after
  // handing the dict to the writer).
  virtual bool should_synchronize_after_execute() const = 0;

  // Blocks until every copy started by Stage has finished; returns the error
  // of the last asynchronous Stage or of a non-blocking copy, if any.
  virtual absl::Status SynchronizeStaging() = 0;

  // Finishes pending staging and releases streams and cached memory. Staged
  // dicts already returned stay valid. Idempotent.
  virtual void Close() = 0;
};

class DefaultStager final : public AsyncStager {
 public:
  // `runtime` is not owned and may be null: the stager then creates one with
  // CreateDeviceRuntime(kAuto) when it first needs one (device tensors or
  // pinned memory) and keeps it alive as long as any staged dict. A runtime
  // passed in must outlive the stager and every staged dict.
  explicit DefaultStager(StagingOptions options = {},
                         DeviceRuntime* runtime = nullptr);
  ~DefaultStager() override;

  Future<StateDict> Stage(const StateDict& state_dict) override;
  Future<StateDict> Stage(const StateDict& state_dict,
                          const DeviceWait& wait) override;
  Future<StateDict> StageReleasing(const StateDict& state_dict,
                                   const DeviceWait& wait,
                                   const Promise<void>& released) override;
  bool should_synchronize_after_execute() const override;
  absl::Status SynchronizeStaging() override;
  void Close() override;

  // Makes, and keeps cached, the staging memory a Stage of `state_dict` (or
  // of any state with the same tensors) will use, mapped, faulted in and
  // page-locked per the options, so that the first Stage blocks no longer
  // than later ones: mapping and pinning fresh memory costs far more than
  // the copy into it (docs/BENCHMARKS.md section 2). Call it when the loop
  // starts, off its critical path. Only the
  // tensors' sizes, devices and places are read, never their bytes. With
  // use_async_staging it runs on the stager's background thread (ordered
  // before later Stages) and the future is ready when the memory is;
  // otherwise on the calling thread. Ready at once without
  // cache_staged_state_dict (nothing would be kept). Errors: as Stage's
  // (kResourceExhausted when the memory cannot be had), kFailedPrecondition
  // after Close().
  Future<void> Reserve(const StateDict& state_dict);

  const StagingOptions& options() const { return options_; }
  // Bytes of staging memory the stager holds for reuse, over all cached
  // buffers (0 after Close or without cache_staged_state_dict).
  size_t cached_bytes() const;
  // Staging buffers the stager has mapped so far (each one a fresh mmap,
  // page faults and, with pinned memory, page-locking).
  int buffers_made() const;
  // Bytes staged so far by copy-on-write snapshots (copied after staging
  // was complete) rather than copied before.
  size_t copy_on_write_bytes() const;

  // Stages on the calling thread; `wait_for_copies` false leaves device
  // copies running (tracked for SynchronizeStaging). With copy_on_write and
  // `filled` non-null, the staged dict may still be filling when it
  // returns: *filled is then set to the snapshot's completion (otherwise
  // left as it is); with `filled` null it waits for the fill. Internal to
  // staging/ (BlockingStager and the async path use it).
  // `landed`, when not null and device copies were left running, is set to
  // their completion (this stage's copies only; set once something waits
  // for them: WaitPendingCopies).
  absl::StatusOr<StateDict> StageNow(const StateDict& state_dict,
                                     bool wait_for_copies,
                                     const DeviceWait& wait = {},
                                     Future<CowSnapshotStats>* filled = nullptr,
                                     Future<void>* landed = nullptr);

 private:
  struct Plan;
  absl::StatusOr<DeviceRuntime*> Runtime() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `populate`: a new buffer's pages are faulted in before it returns
  // (HostBufferOptions::populate).
  absl::StatusOr<std::shared_ptr<HostBuffer>> BufferFor(size_t bytes,
                                                        bool populate = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy streams, made on first use.
  absl::StatusOr<internal_staging::CopyStreams*> Streams()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next copy stream of `device` (round robin over num_streams).
  absl::StatusOr<DeviceStream*> NextStream(int device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The layout of `state_dict` in staging memory.
  absl::StatusOr<Plan> MakePlan(const StateDict& state_dict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReserveNow(const StateDict& state_dict);
  // `filled`: as StageNow's, never null.
  absl::Status CopyAll(const Plan& plan, std::byte* base, bool wait,
                       Future<CowSnapshotStats>* filled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the copies of every stage that left them running, oldest
  // first; gives each stage its own outcome (PendingStage::landed), keeps
  // the first failure for SynchronizeStaging, and returns it.
  absl::Status WaitPendingCopies() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Executor& CpuPool() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StagingOptions options_;
  DeviceRuntime* const external_runtime_;

  // Serializes staging (one StageNow at a time) and guards its state.
  mutable absl::Mutex mu_;
  std::shared_ptr<DeviceRuntime> owned_runtime_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<HostBuffer>> cached_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<internal_staging::CopyStreams> copy_streams_
      ABSL_GUARDED_BY(mu_);
  // One Stage's non-blocking copies, still landing.
  struct PendingStage {
    std::vector<OwnedEvent> events;  // One per stream used.
    // The staging memory they land in, kept until they have landed even
    // if the caller drops the staged dict.
    std::shared_ptr<void> memory;
    Promise<void> landed;  // Their outcome: this stage's only.
  };
  std::deque<PendingStage> pending_ ABSL_GUARDED_BY(mu_);
  // The first failure of a non-blocking copy not yet reported by
  // SynchronizeStaging (the seed's contract: it reports any).
  absl::Status unsynchronized_failure_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int buffers_made_ ABSL_GUARDED_BY(mu_) = 0;
  size_t copy_on_write_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  // Completion of the last async Stage, for SynchronizeStaging/Close. A
  // Future<void>: holding the staged dict here would keep its memory busy
  // and defeat the cache.
  absl::Mutex future_mu_;
  Future<void> last_async_ ABSL_GUARDED_BY(future_mu_);

  // memcpy of CPU tensors; created on first use.
  std::unique_ptr<ThreadPool> cpu_pool_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ThreadPool> background_;  // use_async_staging.
  // Waits for the non-blocking copies of synchronous stages, so that
  // `released` comes without a SynchronizeStaging.
  std::unique_ptr<ThreadPool> landing_waiter_;
};

// Stages synchronously on the calling thread with blocking copies: the
// future returned by Stage is ready and the dict complete. Staging memory
// follows options.use_pinned_memory / use_shared_memory; the async and
// non-blocking switches are ignored.
class BlockingStager final : public AsyncStager {
 public:
  explicit BlockingStager(StagingOptions options = StagingOptions(),
                          DeviceRuntime* runtime = nullptr);

  Future<StateDict> Stage(const StateDict& state_dict) override;
  Future<StateDict> Stage(const StateDict& state_dict,
                          const DeviceWait& wait) override;
  bool should_synchronize_after_execute() const override { return false; }
  absl::Status SynchronizeStaging() override { return absl::OkStatus(); }
  void Close() override { stager_.Close(); }

 private:
  DefaultStager stager_;
};

}  // namespace dcp

#endif  // DCP_STAGING_STAGER_H_
