#include "cuda/host_runtime.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "cuda/host_copy.h"

namespace dcp {
namespace {

constexpr size_t kPageSize = 4096;

size_t RoundUpToPage(size_t bytes) {
  const size_t n = bytes == 0 ? 1 : bytes;
  return (n + kPageSize - 1) / kPageSize * kPageSize;
}

// What an event captured most recently, and whether the stream got there.
struct EventState {
  explicit EventState(bool enable_timing) : timing(enable_timing) {}

  const bool timing;
  absl::Mutex mu;
  uint64_t recorded ABSL_GUARDED_BY(mu) = 0;   // Generation last captured.
  uint64_t completed ABSL_GUARDED_BY(mu) = 0;  // Generation last reached.
  absl::Status status ABSL_GUARDED_BY(mu);     // Stream error when reached.
  absl::Time time ABSL_GUARDED_BY(mu);         // When it was reached.
  DeviceStream* recorder ABSL_GUARDED_BY(mu) = nullptr;  // Last recorded on.

  bool DoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return completed >= recorded;
  }
};

// The handle behind a DeviceEvent*. Pending stream work holds the state by
// shared_ptr, so destroying an event with a record in flight is safe (as on
// CUDA).
struct HostEvent {
  std::shared_ptr<EventState> state;
};

// A stream: one worker thread running tasks in FIFO order. The first failing
// task's Status becomes the stream's sticky error; later tasks see it.
class HostStream {
 public:
  // A task receives the stream's sticky error (OK when none) and returns its
  // own outcome.
  using StreamTask = absl::AnyInvocable<absl::Status(const absl::Status&) &&>;

  HostStream() : worker_([this] { WorkerLoop(); }) {}

  ~HostStream() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    worker_.join();
  }

  void Enqueue(StreamTask task) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(task));
    ++enqueued_;
  }

  absl::Status Synchronize() {
    absl::MutexLock lock(&mu_);
    const uint64_t target = enqueued_;
    auto reached = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return completed_ >= target;
    };
    mu_.Await(absl::Condition(&reached));
    return error_;
  }

 private:
  void WorkerLoop() {
    while (true) {
      StreamTask task;
      absl::Status sticky;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !queue_.empty() || stopping_;
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // Stopping and drained.
        task = std::move(queue_.front());
        queue_.pop_front();
        sticky = error_;
      }
      absl::Status result = std::move(task)(sticky);
      absl::MutexLock lock(&mu_);
      if (!result.ok() && error_.ok()) error_ = std::move(result);
      ++completed_;
    }
  }

  absl::Mutex mu_;
  std::deque<StreamTask> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;  // Last: starts after the members above exist.
};

class HostRuntime final : public DeviceRuntime {
 public:
  explicit HostRuntime(HostRuntimeOptions options)
      : options_(std::move(options)) {}

  ~HostRuntime() override {
    absl::flat_hash_map<DeviceStream*, std::unique_ptr<HostStream>> streams;
    {
      absl::MutexLock lock(&mu_);
      streams.swap(streams_);
    }
    streams.clear();  // Joins the workers after their pending work.
    absl::MutexLock lock(&mu_);
    events_.clear();
    for (const auto& [addr, size] : device_allocs_) {
      munmap(reinterpret_cast<void*>(addr), RoundUpToPage(size));
    }
    for (const auto& [addr, size] : pinned_allocs_) {
      munmap(reinterpret_cast<void*>(addr), size);
    }
  }

  absl::string_view name() const override { return "host"; }
  bool is_host() const override { return true; }
  int DeviceCount() const override { return 1; }

  absl::StatusOr<DeviceProperties> GetDeviceProperties(
      int device) const override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "GetDeviceProperties"));
    DeviceProperties props;
    props.ordinal = 0;
    props.name = "host-memory device";
    props.total_memory = options_.device_memory_limit != 0
                             ? options_.device_memory_limit
                             : static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) *
                                   static_cast<size_t>(sysconf(_SC_PAGESIZE));
    props.async_engine_count = 1;
    props.is_host_emulation = true;
    return props;
  }

  absl::StatusOr<DeviceStream*> CreateStream(int device) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "CreateStream"));
    auto stream = std::make_unique<HostStream>();
    DeviceStream* handle = reinterpret_cast<DeviceStream*>(stream.get());
    absl::MutexLock lock(&mu_);
    streams_.emplace(handle, std::move(stream));
    return handle;
  }

  absl::Status DestroyStream(DeviceStream* stream) override {
    if (stream == nullptr) return absl::OkStatus();
    std::unique_ptr<HostStream> owned;
    {
      absl::MutexLock lock(&mu_);
      auto it = streams_.find(stream);
      if (it == streams_.end()) return UnknownStream(stream, "DestroyStream");
      owned = std::move(it->second);
      streams_.erase(it);
    }
    owned.reset();  // Runs pending work, then joins.
    return absl::OkStatus();
  }

  absl::Status SynchronizeStream(DeviceStream* stream) override {
    DCP_ASSIGN_OR_RETURN(HostStream * s,
                         FindStream(stream, "SynchronizeStream"));
    return s->Synchronize();
  }

  absl::Status StreamWaitEvent(DeviceStream* stream,
                               DeviceEvent* event) override {
    DCP_ASSIGN_OR_RETURN(HostStream * s, FindStream(stream, "StreamWaitEvent"));
    DCP_ASSIGN_OR_RETURN(std::shared_ptr<EventState> state,
                         FindEvent(event, "StreamWaitEvent"));
    uint64_t target;
    DeviceStream* recorder;
    {
      absl::MutexLock lock(&state->mu);
      target = state->recorded;
      recorder = state->recorder;
    }
    s->Enqueue([this, state, target, stream, recorder](const absl::Status&) {
      auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
        return state->completed >= target;
      };
      if (options_.wait_observer) {
        bool blocks;
        {
          absl::MutexLock lock(&state->mu);
          blocks = !reached();
        }
        if (blocks) options_.wait_observer({stream, recorder});
      }
      absl::MutexLock lock(&state->mu);
      state->mu.Await(absl::Condition(&reached));
      return absl::OkStatus();
    });
    return absl::OkStatus();
  }

  // The host runtime's native handles are its own: a DeviceStream* or a
  // DeviceEvent* of this runtime.
  absl::Status StreamWaitNative(DeviceStream* stream,
                                const DeviceWait& wait) override {
    if (wait.kind == DeviceWait::Kind::kEvent) {
      return StreamWaitEvent(stream, static_cast<DeviceEvent*>(wait.handle));
    }
    if (wait.kind != DeviceWait::Kind::kStream) return absl::OkStatus();
    DCP_ASSIGN_OR_RETURN(DeviceEvent * marker,
                         CreateEvent(wait.device, /*enable_timing=*/false));
    absl::Status status =
        RecordEvent(marker, static_cast<DeviceStream*>(wait.handle));
    if (status.ok()) status = StreamWaitEvent(stream, marker);
    DestroyEvent(marker).IgnoreError();  // Pending work holds its state.
    return status;
  }

  absl::StatusOr<DeviceEvent*> CreateEvent(int device,
                                           bool enable_timing) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "CreateEvent"));
    auto event = std::make_unique<HostEvent>();
    event->state = std::make_shared<EventState>(enable_timing);
    DeviceEvent* handle = reinterpret_cast<DeviceEvent*>(event.get());
    absl::MutexLock lock(&mu_);
    events_.emplace(handle, std::move(event));
    return handle;
  }

  absl::Status DestroyEvent(DeviceEvent* event) override {
    if (event == nullptr) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    if (events_.erase(event) == 0) return UnknownEvent(event, "DestroyEvent");
    return absl::OkStatus();
  }

  absl::Status RecordEvent(DeviceEvent* event, DeviceStream* stream) override {
    DCP_ASSIGN_OR_RETURN(HostStream * s, FindStream(stream, "RecordEvent"));
    DCP_ASSIGN_OR_RETURN(std::shared_ptr<EventState> state,
                         FindEvent(event, "RecordEvent"));
    uint64_t generation;
    {
      absl::MutexLock lock(&state->mu);
      generation = ++state->recorded;
      state->recorder = stream;
    }
    s->Enqueue([state, generation](const absl::Status& sticky) {
      absl::MutexLock lock(&state->mu);
      if (generation > state->completed) {
        state->completed = generation;
        state->status = sticky;
        state->time = absl::Now();
      }
      return absl::OkStatus();
    });
    return absl::OkStatus();
  }

  absl::StatusOr<bool> QueryEvent(DeviceEvent* event) override {
    DCP_ASSIGN_OR_RETURN(std::shared_ptr<EventState> state,
                         FindEvent(event, "QueryEvent"));
    absl::MutexLock lock(&state->mu);
    if (!state->DoneLocked()) return false;
    if (!state->status.ok()) return state->status;
    return true;
  }

  absl::Status SynchronizeEvent(DeviceEvent* event) override {
    DCP_ASSIGN_OR_RETURN(std::shared_ptr<EventState> state,
                         FindEvent(event, "SynchronizeEvent"));
    absl::MutexLock lock(&state->mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
      return state->DoneLocked();
    };
    state->mu.Await(absl::Condition(&done));
    return state->status;
  }

  absl::StatusOr<double> ElapsedMillis(DeviceEvent* start,
                                       DeviceEvent* end) override {
    DCP_ASSIGN_OR_RETURN(std::shared_ptr<EventState> a,
                         FindEvent(start, "ElapsedMillis"));
    DCP_ASSIGN_OR_RETURN(std::shared_ptr<EventState> b,
                         FindEvent(end, "ElapsedMillis"));
    absl::Time ta, tb;
    for (auto [state, out] :
         {std::pair{a.get(), &ta}, std::pair{b.get(), &tb}}) {
      absl::MutexLock lock(&state->mu);
      if (!state->timing) {
        return absl::FailedPreconditionError(
            "ElapsedMillis: event was created without timing");
      }
      if (state->recorded == 0 || !state->DoneLocked()) {
        return absl::FailedPreconditionError(
            "ElapsedMillis: event is unrecorded or still pending; synchronize "
            "it first");
      }
      *out = state->time;
    }
    return absl::ToDoubleMilliseconds(tb - ta);
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                         CopyKind kind, DeviceStream* stream) override {
    DCP_ASSIGN_OR_RETURN(HostStream * s, FindStream(stream, "CopyAsync"));
    DCP_RETURN_IF_ERROR(CheckCopy(dst, src, bytes, kind, "CopyAsync"));
    if (bytes == 0) return absl::OkStatus();
    HostCopyTrace trace{
        HostCopyTrace::Phase::kStart, dst, src, bytes, kind, stream};
    s->Enqueue([this, trace](const absl::Status& sticky) mutable {
      if (!sticky.ok()) return absl::OkStatus();  // Skipped after a fault.
      return RunCopy(trace);
    });
    return absl::OkStatus();
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes,
                    CopyKind kind) override {
    DCP_RETURN_IF_ERROR(CheckCopy(dst, src, bytes, kind, "Copy"));
    if (bytes == 0) return absl::OkStatus();
    return RunCopy(HostCopyTrace{HostCopyTrace::Phase::kStart, dst, src, bytes,
                                 kind, nullptr});
  }

  absl::StatusOr<void*> AllocatePinned(size_t bytes) override {
    DCP_ASSIGN_OR_RETURN(void* p, MapPages(bytes, "AllocatePinned"));
    absl::MutexLock lock(&mu_);
    pinned_allocs_[reinterpret_cast<uintptr_t>(p)] = RoundUpToPage(bytes);
    return p;
  }

  absl::Status FreePinned(void* ptr) override {
    if (ptr == nullptr) return absl::OkStatus();
    size_t size;
    {
      absl::MutexLock lock(&mu_);
      auto it = pinned_allocs_.find(reinterpret_cast<uintptr_t>(ptr));
      if (it == pinned_allocs_.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "FreePinned %p: not allocated by AllocatePinned", ptr));
      }
      size = it->second;
      pinned_allocs_.erase(it);
    }
    munmap(ptr, size);
    return absl::OkStatus();
  }

  absl::Status RegisterHost(void* ptr, size_t bytes) override {
    if (ptr == nullptr || bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "RegisterHost %p length=%d: empty range", ptr, bytes));
    }
    const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
    absl::MutexLock lock(&mu_);
    if (Overlaps(registered_, begin, bytes)) {
      return absl::AlreadyExistsError(absl::StrFormat(
          "RegisterHost %p length=%d: range is already registered", ptr,
          bytes));
    }
    registered_[begin] = bytes;
    return absl::OkStatus();
  }

  absl::Status UnregisterHost(void* ptr) override {
    absl::MutexLock lock(&mu_);
    if (registered_.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      return absl::NotFoundError(absl::StrFormat(
          "UnregisterHost %p: not registered with RegisterHost", ptr));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocateDevice(int device, size_t bytes) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "AllocateDevice"));
    const size_t rounded = RoundUpToPage(bytes);
    {
      absl::MutexLock lock(&mu_);
      if (options_.device_memory_limit != 0 &&
          device_bytes_ + rounded > options_.device_memory_limit) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "AllocateDevice %d bytes on host-memory device: %d of %d bytes "
            "in use",
            bytes, device_bytes_, options_.device_memory_limit));
      }
      device_bytes_ += rounded;
    }
    absl::StatusOr<void*> p = MapPages(bytes, "AllocateDevice");
    absl::MutexLock lock(&mu_);
    if (!p.ok()) {
      device_bytes_ -= rounded;
      return p.status();
    }
    device_allocs_[reinterpret_cast<uintptr_t>(*p)] = bytes == 0 ? 1 : bytes;
    return *p;
  }

  absl::StatusOr<DeviceAllocation> FindAllocation(int device,
                                                  const void* ptr) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "FindAllocation"));
    const uintptr_t at = reinterpret_cast<uintptr_t>(ptr);
    absl::MutexLock lock(&mu_);
    auto it = device_allocs_.upper_bound(at);
    if (it != device_allocs_.begin()) {
      --it;
      if (at < it->first + it->second) {
        return DeviceAllocation{reinterpret_cast<const std::byte*>(it->first),
                                it->second};
      }
    }
    return absl::NotFoundError(absl::StrFormat(
        "FindAllocation %p: not in an AllocateDevice allocation", ptr));
  }

  void* NativeStream(DeviceStream* stream) override { return stream; }

  // One pretend device: always current.
  absl::StatusOr<int> SetCurrentDevice(int device) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "SetCurrentDevice"));
    return 0;
  }

  absl::Status FreeDevice(void* ptr) override {
    if (ptr == nullptr) return absl::OkStatus();
    size_t size;
    {
      absl::MutexLock lock(&mu_);
      auto it = device_allocs_.find(reinterpret_cast<uintptr_t>(ptr));
      if (it == device_allocs_.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "FreeDevice %p: not allocated by AllocateDevice", ptr));
      }
      size = RoundUpToPage(it->second);
      device_bytes_ -= size;
      device_allocs_.erase(it);
    }
    munmap(ptr, size);
    return absl::OkStatus();
  }

 private:
  using RangeMap = std::map<uintptr_t, size_t>;  // Start -> length.

  static bool Contains(const RangeMap& ranges, uintptr_t begin, size_t n) {
    auto it = ranges.upper_bound(begin);
    if (it == ranges.begin()) return false;
    --it;
    return begin >= it->first && begin + n <= it->first + it->second;
  }

  static bool Overlaps(const RangeMap& ranges, uintptr_t begin, size_t n) {
    auto it = ranges.lower_bound(begin);
    if (it != ranges.end() && it->first < begin + n) return true;
    if (it == ranges.begin()) return false;
    --it;
    return it->first + it->second > begin;
  }

  static absl::Status CheckDevice(int device, absl::string_view op) {
    if (device != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: device %d does not exist (the host-memory runtime has one "
          "device, 0)",
          op, device));
    }
    return absl::OkStatus();
  }

  static absl::StatusOr<void*> MapPages(size_t bytes, absl::string_view op) {
    void* p = mmap(nullptr, RoundUpToPage(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      absl::Status s =
          ErrnoError(err, absl::StrFormat("%s mmap %d bytes", op, bytes));
      if (err == ENOMEM) return absl::ResourceExhaustedError(s.message());
      return s;
    }
    return p;
  }

  absl::Status CheckCopy(void* dst, const void* src, size_t bytes,
                         CopyKind kind, absl::string_view op) {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s %d bytes: null pointer (dst=%p src=%p)", op,
                          CopyKindName(kind), bytes, dst, src));
    }
    const bool dst_device =
        kind == CopyKind::kHostToDevice || kind == CopyKind::kDeviceToDevice;
    const bool src_device =
        kind == CopyKind::kDeviceToHost || kind == CopyKind::kDeviceToDevice;
    absl::MutexLock lock(&mu_);
    auto check = [&](const void* p, bool device,
                     absl::string_view side) -> absl::Status {
      const uintptr_t a = reinterpret_cast<uintptr_t>(p);
      if (device && !Contains(device_allocs_, a, bytes)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s %s %d bytes: %s %p is not device memory from AllocateDevice "
            "(or the range runs past the allocation); this process runs "
            "the host-memory device runtime, which stands in for CUDA "
            "where no CUDA device is usable: a tensor that says it is on a "
            "CUDA device cannot be saved or loaded here",
            op, CopyKindName(kind), bytes, side, p));
      }
      if (!device && Overlaps(device_allocs_, a, bytes)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s %s %d bytes: %s %p is device memory but the copy kind says "
            "host",
            op, CopyKindName(kind), bytes, side, p));
      }
      return absl::OkStatus();
    };
    DCP_RETURN_IF_ERROR(check(dst, dst_device, "dst"));
    DCP_RETURN_IF_ERROR(check(src, src_device, "src"));
    return absl::OkStatus();
  }

  absl::Status RunCopy(HostCopyTrace trace) {
    trace.phase = HostCopyTrace::Phase::kStart;
    if (options_.copy_fault) {
      absl::Status fault = options_.copy_fault(trace);
      if (!fault.ok()) return fault;
    }
    if (options_.copy_observer) options_.copy_observer(trace);
    BulkHostCopy(trace.dst, trace.src, trace.bytes);  // As DMA would.
    trace.phase = HostCopyTrace::Phase::kEnd;
    if (options_.copy_observer) options_.copy_observer(trace);
    return absl::OkStatus();
  }

  absl::StatusOr<HostStream*> FindStream(DeviceStream* stream,
                                         absl::string_view op) {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return UnknownStream(stream, op);
    return it->second.get();
  }

  absl::StatusOr<std::shared_ptr<EventState>> FindEvent(DeviceEvent* event,
                                                        absl::string_view op) {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(event);
    if (it == events_.end()) return UnknownEvent(event, op);
    return it->second->state;
  }

  static absl::Status UnknownStream(DeviceStream* stream,
                                    absl::string_view op) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: stream %p is not a live stream of this host runtime", op,
        static_cast<void*>(stream)));
  }

  static absl::Status UnknownEvent(DeviceEvent* event, absl::string_view op) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: event %p is not a live event of this host runtime",
                        op, static_cast<void*>(event)));
  }

  const HostRuntimeOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<DeviceStream*, std::unique_ptr<HostStream>> streams_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<DeviceEvent*, std::unique_ptr<HostEvent>> events_
      ABSL_GUARDED_BY(mu_);
  RangeMap device_allocs_ ABSL_GUARDED_BY(mu_);  // Exact requested sizes.
  RangeMap pinned_allocs_ ABSL_GUARDED_BY(mu_);
  RangeMap registered_ ABSL_GUARDED_BY(mu_);
  size_t device_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<DeviceRuntime> CreateHostRuntime(HostRuntimeOptions options) {
  return std::make_unique<HostRuntime>(std::move(options));
}

}  // namespace dcp
