#include "staging/stager.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/blocking_counter.h"
#include "core/status.h"
#include "cuda/host_copy.h"
#include "staging/internal/copy_streams.h"

namespace dcp {
namespace {

// Identity of a tensor for "staged once": the same memory seen the same way.
using TensorKey =
    std::tuple<const void*, DType, Shape, Shape, Device::Kind, int>;

TensorKey KeyOf(const TensorView& v) {
  return {v.data(),    v.dtype(),       v.sizes(),
          v.strides(), v.device().kind, v.device().index};
}

size_t AlignFor(size_t bytes) { return bytes >= 4096 ? 4096 : 64; }

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

std::string Child(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : absl::StrCat(parent, ".", key);
}

// Keeps the staging memory (and the runtime it is registered with, when the
// stager owns it) alive while any staged tensor lives. Members are destroyed
// buffer first, runtime last.
struct StagedMemory {
  std::shared_ptr<DeviceRuntime> runtime;
  std::shared_ptr<HostBuffer> buffer;
};

}  // namespace

StagingOptions StagingOptions::AsyncSaveDefault() {
  StagingOptions o;
  o.use_pinned_memory = false;
  o.use_shared_memory = false;
  o.use_async_staging = false;
  o.use_non_blocking_copy = false;
  return o;
}

// Device tensors up to this size may share a copy with their neighbours;
// larger ones are copied alone (their bytes dwarf a copy's fixed cost).
constexpr size_t kCoalesceMaxTensorBytes = size_t{4} << 20;
// Most gap bytes between two neighbours that one copy carries across.
constexpr size_t kCoalesceMaxGap = size_t{64} << 10;

struct DefaultStager::Plan {
  struct Slot {
    TensorView source;
    std::string name;  // First key that reached the tensor.
    size_t offset = 0;
    bool in_span = false;  // Staged by a Span's copy.
  };
  // One copy that stages neighbouring device tensors together: device bytes
  // [source, source + length) land at base + offset, each tensor at its own
  // slot offset inside.
  struct Span {
    int device = 0;
    const std::byte* source = nullptr;
    size_t length = 0;
    size_t offset = 0;
    size_t first_slot = 0;
    size_t tensors = 0;
  };
  std::vector<Slot> slots;
  std::vector<Span> spans;
  std::map<TensorKey, size_t> index;
  size_t total = 0;
  bool has_device = false;

  absl::Status AddTensor(const Tensor& t, const std::string& name) {
    const TensorView& v = t.view();
    if (v.nbytes() > 0 && v.data() == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("staging tensor '%s': %s %s has no data", name,
                          DTypeName(v.dtype()), ShapeToString(v.sizes())));
    }
    for (int64_t stride : v.strides()) {
      if (stride < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "staging tensor '%s': negative strides are not supported", name));
      }
    }
    auto [it, inserted] = index.emplace(KeyOf(v), slots.size());
    if (!inserted) return absl::OkStatus();
    total = AlignUp(total, AlignFor(v.nbytes()));
    slots.push_back({v, name, total});
    total += v.nbytes();
    has_device = has_device || v.device().is_cuda();
    return absl::OkStatus();
  }

  absl::Status AddValue(const StateValue& value, const std::string& name) {
    switch (value.kind()) {
      case StateValue::Kind::kTensor:
        return AddTensor(value.tensor(), name);
      case StateValue::Kind::kShardedTensor: {
        const auto& shards = value.sharded_tensor().local_shards();
        for (size_t i = 0; i < shards.size(); ++i) {
          DCP_RETURN_IF_ERROR(AddTensor(shards[i].tensor,
                                        absl::StrCat(name, "[shard ", i, "]")));
        }
        return absl::OkStatus();
      }
      case StateValue::Kind::kDict:
        for (const auto& [key, child] : value.dict()) {
          DCP_RETURN_IF_ERROR(AddValue(child, Child(name, key)));
        }
        return absl::OkStatus();
      case StateValue::Kind::kList:
        for (size_t i = 0; i < value.list().size(); ++i) {
          DCP_RETURN_IF_ERROR(
              AddValue(value.list()[i], Child(name, absl::StrCat(i))));
        }
        return absl::OkStatus();
      default:
        return absl::OkStatus();
    }
  }

  // Lays out small contiguous device tensors that lie close together in one
  // device allocation as they lie there, so that one copy stages them all:
  // every copy costs the copy engine a fixed time whatever its size, more
  // than a small tensor's bytes take (docs/BENCHMARKS.md section 2). A
  // span's copy carries the gap bytes between its tensors too:
  // at most kCoalesceMaxGap each, at most its tensors' bytes plus
  // kCoalesceMaxGap in all, and the span at most `max_span`. It never
  // crosses an allocation, so every byte it reads is mapped. Recomputes
  // every slot's offset and `total`.
  void CoalesceDeviceCopies(DeviceRuntime& runtime, size_t max_span) {
    auto begin = [&](size_t i) {
      return static_cast<const std::byte*>(slots[i].source.data());
    };
    auto end = [&](size_t i) { return begin(i) + slots[i].source.nbytes(); };
    std::vector<size_t> small;
    for (size_t i = 0; i < slots.size(); ++i) {
      const TensorView& v = slots[i].source;
      if (v.device().is_cuda() && v.device().index >= 0 &&
          v.device().index < runtime.DeviceCount() && v.is_contiguous() &&
          v.nbytes() > 0 && v.nbytes() <= kCoalesceMaxTensorBytes) {
        small.push_back(i);
      }
    }
    if (small.size() < 2) return;
    std::sort(small.begin(), small.end(), [&](size_t a, size_t b) {
      const int da = slots[a].source.device().index;
      const int db = slots[b].source.device().index;
      return da != db ? da < db
                      : std::less<const std::byte*>()(begin(a), begin(b));
    });
    std::vector<std::vector<size_t>> groups;
    std::vector<size_t> group;
    DeviceAllocation allocation;
    size_t useful = 0;
    auto close = [&] {
      if (group.size() >= 2) groups.push_back(group);
      group.clear();
    };
    for (size_t i : small) {
      const int device = slots[i].source.device().index;
      const size_t n = slots[i].source.nbytes();
      if (!group.empty()) {
        const std::byte* first = begin(group.front());
        const std::byte* last_end = end(group.back());
        const bool joins =
            device == slots[group.front()].source.device().index &&
            begin(i) >= last_end &&
            static_cast<size_t>(begin(i) - last_end) <= kCoalesceMaxGap &&
            end(i) <= allocation.base + allocation.size &&
            static_cast<size_t>(end(i) - first) <= max_span &&
            static_cast<size_t>(end(i) - first) <=
                2 * (useful + n) + kCoalesceMaxGap;
        if (joins) {
          group.push_back(i);
          useful += n;
          continue;
        }
        close();
      }
      absl::StatusOr<DeviceAllocation> found =
          runtime.FindAllocation(device, begin(i));
      if (!found.ok() || begin(i) < found->base ||
          end(i) > found->base + found->size) {
        continue;  // Copied alone.
      }
      allocation = *found;
      group.push_back(i);
      useful = n;
    }
    close();
    if (groups.empty()) return;
    for (const std::vector<size_t>& g : groups) {
      for (size_t i : g) slots[i].in_span = true;
    }
    total = 0;
    for (Slot& slot : slots) {
      if (slot.in_span) continue;
      total = AlignUp(total, AlignFor(slot.source.nbytes()));
      slot.offset = total;
      total += slot.source.nbytes();
    }
    for (const std::vector<size_t>& g : groups) {
      const std::byte* first = begin(g.front());
      // Each tensor keeps its device address's place within a 4 KiB page.
      const size_t offset =
          AlignUp(total, 4096) + reinterpret_cast<uintptr_t>(first) % 4096;
      for (size_t i : g) {
        slots[i].offset = offset + static_cast<size_t>(begin(i) - first);
      }
      const size_t length = static_cast<size_t>(end(g.back()) - first);
      spans.push_back({slots[g.front()].source.device().index, first, length,
                       offset, g.front(), g.size()});
      total = offset + length;
    }
  }

  // The staged twin of `t`.
  Tensor Staged(const Tensor& t, std::byte* base,
                const std::shared_ptr<void>& owner) const {
    const Slot& slot = slots[index.at(KeyOf(t.view()))];
    TensorView view(t.nbytes() == 0 ? nullptr : base + slot.offset, t.dtype(),
                    t.sizes(), Device::Cpu());
    return Tensor::WithOwner(std::move(view), owner);
  }

  StateValue Build(const StateValue& value, std::byte* base,
                   const std::shared_ptr<void>& owner) const {
    switch (value.kind()) {
      case StateValue::Kind::kTensor:
        return Staged(value.tensor(), base, owner);
      case StateValue::Kind::kShardedTensor: {
        const ShardedTensor& st = value.sharded_tensor();
        std::vector<Shard> shards;
        for (const Shard& s : st.local_shards()) {
          shards.push_back({s.offsets, Staged(s.tensor, base, owner)});
        }
        return ShardedTensor(st.dtype(), st.global_sizes(), std::move(shards));
      }
      case StateValue::Kind::kDict: {
        StateDict out;
        for (const auto& [key, child] : value.dict()) {
          out.emplace(key, Build(child, base, owner));
        }
        return out;
      }
      case StateValue::Kind::kList: {
        StateList out;
        out.reserve(value.list().size());
        for (const StateValue& child : value.list()) {
          out.push_back(Build(child, base, owner));
        }
        return out;
      }
      default:
        return value;  // Plain values are copied.
    }
  }
};

DefaultStager::DefaultStager(StagingOptions options, DeviceRuntime* runtime)
    : options_(std::move(options)), external_runtime_(runtime) {
  if (options_.use_async_staging) background_ = std::make_unique<ThreadPool>(1);
  if (!options_.use_async_staging && options_.use_non_blocking_copy) {
    landing_waiter_ = std::make_unique<ThreadPool>(1);
  }
}

DefaultStager::~DefaultStager() {
  Close();
  background_.reset();  // Joins after any task still queued.
  landing_waiter_.reset();
  absl::MutexLock lock(&mu_);
  cpu_pool_.reset();
}

absl::StatusOr<DeviceRuntime*> DefaultStager::Runtime() {
  if (external_runtime_ != nullptr) return external_runtime_;
  if (owned_runtime_ == nullptr) {
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<DeviceRuntime> runtime,
                         CreateDeviceRuntime(DeviceRuntimeMode::kAuto));
    owned_runtime_ = std::move(runtime);
  }
  return owned_runtime_.get();
}

absl::StatusOr<std::shared_ptr<HostBuffer>> DefaultStager::BufferFor(
    size_t bytes, bool populate) {
  // The smallest free cached buffer that is large enough (free: no staged
  // dict from before still uses it).
  std::shared_ptr<HostBuffer>* reusable = nullptr;
  std::shared_ptr<HostBuffer>* replaceable = nullptr;  // Free, too small.
  for (std::shared_ptr<HostBuffer>& buffer : cached_) {
    if (buffer.use_count() != 1) continue;
    if (buffer->size() < bytes) {
      replaceable = &buffer;
    } else if (reusable == nullptr || buffer->size() < (*reusable)->size()) {
      reusable = &buffer;
    }
  }
  if (options_.cache_staged_state_dict && reusable != nullptr) {
    return *reusable;
  }
  DeviceRuntime* runtime = nullptr;
  if (options_.use_pinned_memory) {
    DCP_ASSIGN_OR_RETURN(runtime, Runtime());
  }
  HostBufferOptions buffer_options;
  buffer_options.pinned = options_.use_pinned_memory;
  buffer_options.shared = options_.use_shared_memory;
  buffer_options.name = "dcp-staged-state-dict";
  buffer_options.recycle = options_.recycle_staging_memory;
  buffer_options.populate = populate;
  DCP_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buffer,
                       HostBuffer::Create(bytes, runtime, buffer_options));
  ++buffers_made_;
  if (options_.cache_staged_state_dict) {
    if (replaceable != nullptr) {
      *replaceable = buffer;  // Unmaps the old one (nobody uses it).
    } else if (static_cast<int>(cached_.size()) <
               std::max(1, options_.max_cached_buffers)) {
      cached_.push_back(buffer);
    }  // Else every cached buffer is busy: this one is not kept.
  }
  return buffer;
}

absl::StatusOr<internal_staging::CopyStreams*> DefaultStager::Streams() {
  DCP_ASSIGN_OR_RETURN(DeviceRuntime * runtime, Runtime());
  if (copy_streams_ == nullptr) {
    copy_streams_ = std::make_unique<internal_staging::CopyStreams>(
        runtime, options_.num_streams);
  }
  return copy_streams_.get();
}

absl::StatusOr<DeviceStream*> DefaultStager::NextStream(int device) {
  DCP_ASSIGN_OR_RETURN(internal_staging::CopyStreams * streams, Streams());
  return streams->Next(device);
}

Executor& DefaultStager::CpuPool() {
  if (cpu_pool_ == nullptr) {  // Only states with CPU tensors need threads.
    int threads = options_.cpu_copy_threads;
    if (threads <= 0) {
      threads = std::clamp(
          static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
    }
    cpu_pool_ = std::make_unique<ThreadPool>(threads);
  }
  return *cpu_pool_;
}

absl::Status DefaultStager::WaitPendingCopies() {
  absl::Status first;
  DeviceRuntime* runtime =
      external_runtime_ != nullptr ? external_runtime_ : owned_runtime_.get();
  while (!pending_.empty()) {
    PendingStage stage = std::move(pending_.front());
    pending_.pop_front();
    absl::Status landed;
    for (OwnedEvent& event : stage.events) {
      absl::Status s = runtime->SynchronizeEvent(event.get());
      if (landed.ok() && !s.ok()) {
        landed = Annotate(s, "non-blocking staging copy");
      }
    }
    if (first.ok()) first = landed;
    stage.landed.Set(landed);
  }
  if (unsynchronized_failure_.ok()) unsynchronized_failure_ = first;
  return first;
}

absl::Status DefaultStager::CopyAll(const Plan& plan, std::byte* base,
                                    bool wait,
                                    Future<CowSnapshotStats>* filled) {
  // 1. Device tensors: enqueue pieces round robin over the device's streams.
  std::map<DeviceStream*, int> used;  // Stream -> device.
  absl::Status error;
  DeviceRuntime* runtime = nullptr;
  if (plan.has_device) {
    DCP_ASSIGN_OR_RETURN(runtime, Runtime());
  }
  for (const Plan::Span& span : plan.spans) {
    absl::StatusOr<DeviceStream*> stream = NextStream(span.device);
    if (!stream.ok()) {
      error = stream.status();
      break;
    }
    used[*stream] = span.device;
    error = runtime->CopyAsync(base + span.offset, span.source, span.length,
                               CopyKind::kDeviceToHost, *stream);
    if (!error.ok()) {
      error = Annotate(
          error,
          absl::StrFormat("staging tensor '%s' and its %d neighbours "
                          "in one copy",
                          plan.slots[span.first_slot].name, span.tensors - 1));
      break;
    }
  }
  for (const Plan::Slot& slot : plan.slots) {
    const TensorView& v = slot.source;
    if (!error.ok()) break;
    if (!v.device().is_cuda() || v.nbytes() == 0 || slot.in_span) continue;
    const int device = v.device().index;
    if (device < 0 || device >= runtime->DeviceCount()) {
      error = absl::InvalidArgumentError(absl::StrFormat(
          "staging tensor '%s': on %s but the %s runtime has %d device(s)",
          slot.name, v.device().ToString(), runtime->name(),
          runtime->DeviceCount()));
      break;
    }
    if (!v.is_contiguous()) {
      // Rare: copy the covering range, then gather on the host.
      size_t span = 1;
      for (int64_t d = 0; d < v.dim(); ++d) {
        span += static_cast<size_t>(v.sizes()[d] - 1) * v.strides()[d];
      }
      const size_t elem = ElementSize(v.dtype());
      std::vector<std::byte> covering(span * elem);
      // On a copy stream, so it follows the caller's stream like the rest.
      absl::StatusOr<DeviceStream*> stream = NextStream(device);
      error = stream.status();
      if (error.ok()) {
        error = runtime->CopyAsync(covering.data(), v.data(), covering.size(),
                                   CopyKind::kDeviceToHost, *stream);
      }
      if (error.ok()) error = runtime->SynchronizeStream(*stream);
      if (!error.ok()) {
        error = Annotate(error, absl::StrCat("staging tensor '", slot.name,
                                             "' (non-contiguous)"));
        break;
      }
      absl::StatusOr<Tensor> gathered =
          Tensor::Wrap(TensorView(covering.data(), v.dtype(), v.sizes(),
                                  v.strides(), Device::Cpu()))
              .ContiguousHostCopy();
      if (!gathered.ok()) {
        error = gathered.status();
        break;
      }
      std::memcpy(base + slot.offset, gathered->data(), v.nbytes());
      continue;
    }
    const size_t piece = std::max<size_t>(options_.copy_chunk_bytes, 4096);
    for (size_t off = 0; off < v.nbytes() && error.ok(); off += piece) {
      absl::StatusOr<DeviceStream*> stream = NextStream(device);
      if (!stream.ok()) {
        error = stream.status();
        break;
      }
      used[*stream] = device;
      error = runtime->CopyAsync(base + slot.offset + off,
                                 static_cast<const std::byte*>(v.data()) + off,
                                 std::min(piece, v.nbytes() - off),
                                 CopyKind::kDeviceToHost, *stream);
    }
    if (!error.ok()) {
      error = Annotate(error, absl::StrCat("staging tensor '", slot.name, "'"));
      break;
    }
  }

  // 2. CPU tensors: memcpy pieces on the copy threads, while the device
  // copies run; with copy_on_write, contiguous ones are snapshot and only
  // what the snapshot leaves is copied.
  if (error.ok()) {
    struct Task {
      std::byte* dst;
      const std::byte* src;    // Null: gather the non-contiguous slot.
      const Plan::Slot* slot;  // For src null.
      size_t length;
    };
    std::vector<Task> tasks;
    std::vector<HostCopy> contiguous;
    for (const Plan::Slot& slot : plan.slots) {
      const TensorView& v = slot.source;
      if (!v.device().is_cpu() || v.nbytes() == 0) continue;
      if (!v.is_contiguous()) {
        tasks.push_back({base + slot.offset, nullptr, &slot, v.nbytes()});
        continue;
      }
      contiguous.push_back({base + slot.offset,
                            static_cast<const std::byte*>(v.data()),
                            v.nbytes()});
    }
    if (options_.copy_on_write && !contiguous.empty()) {
      absl::StatusOr<CowSnapshot> snapshot = TakeCowSnapshot(contiguous);
      if (snapshot.ok()) {
        size_t left = 0;
        for (const HostCopy& c : snapshot->to_copy) left += c.bytes;
        for (const HostCopy& c : contiguous) copy_on_write_bytes_ += c.bytes;
        copy_on_write_bytes_ -= left;
        contiguous = std::move(snapshot->to_copy);
        *filled = snapshot->filled;
      }  // Otherwise (no userfaultfd) copy them all.
    }
    const size_t piece = kHostCopyPieceBytes;
    for (const HostCopy& c : contiguous) {
      for (size_t off = 0; off < c.bytes; off += piece) {
        tasks.push_back({c.dst + off, c.src + off, nullptr,
                         std::min(piece, c.bytes - off)});
      }
    }
    absl::BlockingCounter done(static_cast<int>(tasks.size()));
    absl::Mutex task_mu;
    absl::Status task_error;
    for (const Task& task : tasks) {
      CpuPool().Schedule([&, task] {
        if (task.src != nullptr) {
          BulkHostCopy(task.dst, task.src, task.length);
        } else {
          absl::StatusOr<Tensor> gathered =
              Tensor::Wrap(task.slot->source).ContiguousHostCopy();
          if (gathered.ok()) {
            std::memcpy(task.dst, gathered->data(), task.length);
          } else {
            absl::MutexLock lock(&task_mu);
            if (task_error.ok()) task_error = gathered.status();
          }
        }
        done.DecrementCount();
      });
    }
    done.Wait();
    error = task_error;
  }

  // 3. One event per stream used; wait for them now or leave them pending.
  std::vector<OwnedEvent> events;
  for (const auto& [stream, device] : used) {
    if (!error.ok()) {
      // Copies may still target the buffer: let them land before it goes.
      runtime->SynchronizeStream(stream).IgnoreError();
      continue;
    }
    absl::StatusOr<OwnedEvent> event =
        MakeOwnedEvent(*runtime, device, /*enable_timing=*/false);
    if (event.ok()) {
      absl::Status recorded = runtime->RecordEvent(event->get(), stream);
      if (recorded.ok()) {
        events.push_back(*std::move(event));
        continue;
      }
      event = recorded;
    }
    error = event.status();
    runtime->SynchronizeStream(stream).IgnoreError();
  }
  if (!error.ok()) {
    for (OwnedEvent& e : events)
      runtime->SynchronizeEvent(e.get()).IgnoreError();
    return error;
  }
  if (!wait) {
    if (!events.empty()) {
      pending_.push_back(PendingStage{std::move(events), nullptr, {}});
    }
    return absl::OkStatus();
  }
  for (OwnedEvent& e : events) {
    absl::Status s = runtime->SynchronizeEvent(e.get());
    if (error.ok() && !s.ok()) error = Annotate(s, "staging device copy");
  }
  return error;
}

absl::StatusOr<DefaultStager::Plan> DefaultStager::MakePlan(
    const StateDict& state_dict) {
  Plan plan;
  for (const auto& [key, value] : state_dict) {
    DCP_RETURN_IF_ERROR(plan.AddValue(value, key));
  }
  if (plan.has_device && options_.coalesce_device_copies) {
    DCP_ASSIGN_OR_RETURN(DeviceRuntime * runtime, Runtime());
    plan.CoalesceDeviceCopies(
        *runtime, std::max<size_t>(options_.copy_chunk_bytes, 4096));
  }
  return plan;
}

absl::Status DefaultStager::ReserveNow(const StateDict& state_dict) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    return absl::FailedPreconditionError(
        "DefaultStager: Reserve called after Close");
  }
  DCP_ASSIGN_OR_RETURN(Plan plan, MakePlan(state_dict));
  // What the first Stage would otherwise make too: the copy streams of each
  // device and the CPU copy threads.
  std::set<int> devices;
  bool has_cpu = false;
  for (const Plan::Slot& slot : plan.slots) {
    if (slot.source.device().is_cuda())
      devices.insert(slot.source.device().index);
    has_cpu = has_cpu || slot.source.device().is_cpu();
  }
  for (int device : devices) DCP_RETURN_IF_ERROR(NextStream(device).status());
  if (has_cpu) CpuPool();
  if (plan.total == 0) return absl::OkStatus();
  // BufferFor keeps the buffer cached; nobody holds it, so it is free for
  // the next Stage.
  return BufferFor(plan.total).status();
}

Future<void> DefaultStager::Reserve(const StateDict& state_dict) {
  if (!options_.cache_staged_state_dict) {
    return Future<void>::Ready(absl::OkStatus());
  }
  if (!options_.use_async_staging) {
    return Future<void>::Ready(ReserveNow(state_dict));
  }
  Promise<void> done;
  background_->Schedule(
      [this, state_dict, done] { done.Set(ReserveNow(state_dict)); });
  return done.future();
}

absl::StatusOr<StateDict> DefaultStager::StageNow(
    const StateDict& state_dict, bool wait_for_copies, const DeviceWait& wait,
    Future<CowSnapshotStats>* filled, Future<void>* landed) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    return absl::FailedPreconditionError(
        "DefaultStager: Stage called after Close");
  }
  // Copies still landing from earlier non-blocking Stages first (their
  // memory may be this one's). A failure there is theirs: their `landed`
  // and SynchronizeStaging report it, not this Stage.
  WaitPendingCopies().IgnoreError();
  DCP_ASSIGN_OR_RETURN(Plan plan, MakePlan(state_dict));
  std::shared_ptr<StagedMemory> memory = std::make_shared<StagedMemory>();
  std::byte* base = nullptr;
  if (plan.total > 0) {
    // With copy_on_write the copies into a new buffer run in the
    // background: its pages are faulted in there, not before staging is
    // complete. (Reserve populates.)
    DCP_ASSIGN_OR_RETURN(memory->buffer,
                         BufferFor(plan.total, !options_.copy_on_write));
    base = memory->buffer->data();
  }
  if (plan.has_device || options_.use_pinned_memory) {
    DCP_RETURN_IF_ERROR(Runtime().status());
  }
  memory->runtime = owned_runtime_;
  if (plan.has_device && !wait.empty()) {
    for (const Plan::Slot& slot : plan.slots) {
      const Device device = slot.source.device();
      if (device.is_cuda() && device.index != wait.device) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "staging tensor '%s': on %s, but the caller's stream to wait "
            "for (SaveOptions::device_wait) is on cuda:%d; save tensors of "
            "one device per call",
            slot.name, device.ToString(), wait.device));
      }
    }
    DCP_ASSIGN_OR_RETURN(internal_staging::CopyStreams * streams, Streams());
    DCP_RETURN_IF_ERROR(Annotate(streams->WaitFor(wait),
                                 "staging: waiting for the caller's stream"));
  }
  Future<CowSnapshotStats> filling;
  const absl::Status copied = CopyAll(plan, base, wait_for_copies, &filling);
  if (filling.valid()) {
    if (!copied.ok() || filled == nullptr) {
      // The snapshot reads the sources and writes the buffer until filled.
      filling.Wait().IgnoreError();
    } else {
      // The buffer stays mapped until filled, even if the staged dict goes.
      filling.OnReady([memory](const absl::StatusOr<CowSnapshotStats>&) {});
      *filled = filling;
    }
  }
  DCP_RETURN_IF_ERROR(copied);
  if (!pending_.empty()) {  // This Stage's copies (the earlier landed above).
    pending_.back().memory = memory;
    if (landed != nullptr) *landed = pending_.back().landed.future();
  }
  StateDict staged;
  for (const auto& [key, value] : state_dict) {
    staged.emplace(key, plan.Build(value, base, memory));
  }
  return staged;
}

Future<StateDict> DefaultStager::Stage(const StateDict& state_dict) {
  return Stage(state_dict, DeviceWait{});
}

Future<StateDict> DefaultStager::Stage(const StateDict& state_dict,
                                       const DeviceWait& wait) {
  return StageReleasing(state_dict, wait, Promise<void>());
}

namespace {

// `staged`, ready once `filled` (when valid) is.
Future<StateDict> WhenFilled(absl::StatusOr<StateDict> staged,
                             const Future<CowSnapshotStats>& filled) {
  if (!filled.valid() || !staged.ok()) {
    return Future<StateDict>::Ready(std::move(staged));
  }
  Promise<StateDict> promise;
  filled.OnReady([promise, staged = *std::move(staged)](
                     const absl::StatusOr<CowSnapshotStats>& stats) mutable {
    if (stats.ok()) {
      promise.Set(std::move(staged));
    } else {
      promise.Set(stats.status());
    }
  });
  return promise.future();
}

// An async Stage's end, once the sources are released with `status`: waits
// for `filled` (when valid), then gives `done` the status and `promise` the
// staged dict or the first error. `done` first: the promise's callbacks may
// call SynchronizeStaging or Close, which wait for `done`.
void FinishStage(absl::Status status, StateDict staged,
                 const Future<CowSnapshotStats>& filled,
                 const Promise<StateDict>& promise, const Promise<void>& done) {
  if (status.ok() && filled.valid()) status = filled.Wait().status();
  done.Set(status);
  if (status.ok()) {
    promise.Set(std::move(staged));
  } else {
    promise.Set(status);
  }
}

}  // namespace

Future<StateDict> DefaultStager::StageReleasing(const StateDict& state_dict,
                                                const DeviceWait& wait,
                                                const Promise<void>& released) {
  if (!options_.use_async_staging) {
    Future<CowSnapshotStats> filled;
    Future<void> landed;
    absl::StatusOr<StateDict> staged = StageNow(
        state_dict, !options_.use_non_blocking_copy, wait, &filled, &landed);
    if (staged.ok() && landed.valid()) {
      // The sources are read until this stage's copies land.
      landed.OnReady([released](const absl::Status& s) { released.Set(s); });
      landing_waiter_->Schedule([this] {
        absl::MutexLock lock(&mu_);
        WaitPendingCopies().IgnoreError();
      });
    } else {
      released.Set(staged.status());
    }
    return WhenFilled(std::move(staged), filled);
  }
  Promise<StateDict> promise;
  Promise<void> done;
  if (!wait.empty()) {
    // The caller's stream is marked now, on the calling thread, and the
    // copies enqueued behind the mark (the host does not wait for them):
    // work the caller enqueues after Stage returns is never waited for,
    // and never copied. The background thread waits for the copies.
    Future<CowSnapshotStats> filled;
    Future<void> copies;
    absl::StatusOr<StateDict> staged =
        StageNow(state_dict, /*wait_for_copies=*/false, wait, &filled, &copies);
    if (!staged.ok()) {
      released.Set(staged.status());
      return Future<StateDict>::Ready(staged.status());
    }
    {
      absl::MutexLock lock(&future_mu_);
      last_async_ = done.future();
    }
    background_->Schedule([this, staged = *std::move(staged), filled, copies,
                           promise, released, done]() mutable {
      absl::Status landed;
      if (copies.valid()) {
        {
          absl::MutexLock lock(&mu_);
          WaitPendingCopies().IgnoreError();
        }
        landed = copies.Wait();  // This stage's own copies.
      }
      released.Set(landed);
      FinishStage(landed, std::move(staged), filled, promise, done);
    });
    return promise.future();
  }
  {
    absl::MutexLock lock(&future_mu_);
    last_async_ = done.future();
  }
  background_->Schedule([this, state_dict, promise, released, done, wait] {
    Future<CowSnapshotStats> filled;
    absl::StatusOr<StateDict> staged =
        StageNow(state_dict, /*wait_for_copies=*/true, wait, &filled);
    released.Set(staged.status());
    FinishStage(staged.status(), staged.ok() ? *std::move(staged) : StateDict(),
                filled, promise, done);
  });
  return promise.future();
}

bool DefaultStager::should_synchronize_after_execute() const {
  return !options_.use_async_staging && options_.use_non_blocking_copy;
}

absl::Status DefaultStager::SynchronizeStaging() {
  absl::Status status;
  Future<void> last;
  {
    absl::MutexLock lock(&future_mu_);
    last = last_async_;
  }
  if (last.valid()) status = last.Wait();
  absl::MutexLock lock(&mu_);
  WaitPendingCopies().IgnoreError();
  absl::Status copies =
      std::exchange(unsynchronized_failure_, absl::OkStatus());
  return status.ok() ? copies : status;
}

void DefaultStager::Close() {
  SynchronizeStaging().IgnoreError();
  absl::MutexLock lock(&mu_);
  // A Stage on another thread may have left copies running since: they
  // land before the streams and the runtime they use go.
  WaitPendingCopies().IgnoreError();
  closed_ = true;
  copy_streams_.reset();  // Before the runtime they belong to.
  cached_.clear();
  owned_runtime_.reset();  // Staged dicts keep it alive while they need it.
}

int DefaultStager::buffers_made() const {
  absl::MutexLock lock(&mu_);
  return buffers_made_;
}

size_t DefaultStager::copy_on_write_bytes() const {
  absl::MutexLock lock(&mu_);
  return copy_on_write_bytes_;
}

size_t DefaultStager::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  size_t bytes = 0;
  for (const std::shared_ptr<HostBuffer>& buffer : cached_) {
    bytes += buffer->size();
  }
  return bytes;
}

BlockingStager::BlockingStager(StagingOptions options, DeviceRuntime* runtime)
    : stager_(
          [&] {
            options.use_async_staging = false;
            options.use_non_blocking_copy = false;
            options.copy_on_write = false;
            return options;
          }(),
          runtime) {}

Future<StateDict> BlockingStager::Stage(const StateDict& state_dict) {
  return stager_.Stage(state_dict);
}

Future<StateDict> BlockingStager::Stage(const StateDict& state_dict,
                                        const DeviceWait& wait) {
  return stager_.Stage(state_dict, wait);
}

}  // namespace dcp
