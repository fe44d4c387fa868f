// The io_uring IoEngine (liburing): one ring per submitting thread.
//
// A thread's first Submit binds it to a ring of its own (a free one, or a
// new one up to IoEngineOptions::max_rings; beyond that threads share the
// least-bound ring); the binding lives in a thread_local and returns the ring
// to the free list when the thread exits, so short-lived writer threads reuse
// rings instead of creating one per save. The submitting thread fills the
// ring's submission queue and enters the kernel itself: no hand-off to
// another thread on the way out.
//
// Each ring has one reaper thread that waits on its completion queue, records
// results, resubmits short transfers and EINTR/EAGAIN for the remainder, and
// fulfils futures (so callbacks run there). The two sides of a ring are
// independent in io_uring (one thread may submit while another reaps); the
// submission side is guarded by the ring's mutex because the reaper also
// submits (resubmissions, and parts that waited for a free slot: a ring
// never has more than queue_depth I/Os in flight, the rest wait in its
// queue). Work started from a completion callback (an fsync released by its
// file's last write) goes to the reaper's own ring.
//
// Parts whose File has no descriptor (FaultInjectionFileSystem) run on a
// small helper pool through the File's methods.
#include <fcntl.h>
#include <liburing.h>
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/executor.h"
#include "core/status.h"
#include "io/internal/io_engine_base.h"
#include "io/io_engine.h"

namespace dcp {
namespace internal_io {
namespace {

std::atomic<int> forced_setup_error{0};
std::atomic<uint64_t> next_engine_id{1};

// user_data of the NOP that wakes a reaper to stop; parts use their address.
constexpr uint64_t kStopTag = 1;

// Held while a ring's memory is mapped (io_uring_queue_init) or unmapped
// (io_uring_queue_exit). The kernel may map a new ring where an old one was,
// and liburing maps with raw system calls that sanitizers do not see; the
// mutex orders every access to the old ring (its users synchronize with the
// teardown through the ring's own mutex and the reaper's join) before every
// access to the new one, so ThreadSanitizer sees the reuse as ordered.
absl::Mutex ring_mapping_mu(absl::kConstInit);

// A part goes from the submitting thread to the reaper through the kernel
// (its address is the SQE's user_data, which comes back in the CQE): a
// happens-before edge that ThreadSanitizer cannot see, so it is told
// (--config=tsan; nothing otherwise).
void HandToKernel(Part* part) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(part);
#else
  (void)part;
#endif
}

void TakeFromKernel(Part* part) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(part);
#else
  (void)part;
#endif
}

// The next piece of a writeback: as much as an SQE's 32-bit length holds.
// Never 0 (sync_file_range reads 0 as "to the end of the file"): the base
// completes empty writebacks without issuing them.
unsigned WritebackPiece(const Part& part) {
  return static_cast<unsigned>(
      std::min<size_t>(part.length - part.done, size_t{1} << 30));
}

class Ring {
 public:
  // A ring of `depth` entries with `registration` as its fixed buffers (a
  // refusal leaves it without them), and its reaper thread.
  static absl::StatusOr<std::unique_ptr<Ring>> Create(
      int depth, int max_buffered_reads, uint64_t engine_id,
      absl::Span<const iovec> registration) {
    if (int forced = forced_setup_error.load(); forced != 0) {
      return ErrnoError(forced, "io_uring_queue_init (forced by test)");
    }
    auto ring =
        std::unique_ptr<Ring>(new Ring(depth, max_buffered_reads, engine_id));
    int ret;
    {
      absl::MutexLock mapping(&ring_mapping_mu);
      ret = io_uring_queue_init(static_cast<unsigned>(depth), &ring->ring_, 0);
    }
    if (ret < 0) {
      return ErrnoError(-ret,
                        absl::StrCat("io_uring_queue_init depth=", depth));
    }
    ring->initialized_ = true;
    if (!registration.empty()) {
      absl::MutexLock lock(&ring->mu_);
      ring->ApplyRegistrationLocked(registration).IgnoreError();
    }
    ring->reaper_ = std::thread([r = ring.get()] { r->ReapLoop(); });
    return ring;
  }

  ~Ring() {
    if (reaper_.joinable()) {
      {
        absl::MutexLock lock(&mu_);
        stopping_ = true;
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, kStopTag);
        ++in_flight_;
        io_uring_submit(&ring_);
      }
      reaper_.join();
    }
    if (initialized_) {
      absl::MutexLock mapping(&ring_mapping_mu);
      io_uring_queue_exit(&ring_);
    }
  }

  // Issues `parts` (any thread): as many as fit in the ring now, the rest
  // when earlier ones complete.
  void Submit(std::vector<std::unique_ptr<Part>> parts) {
    absl::MutexLock lock(&mu_);
    for (std::unique_ptr<Part>& part : parts)
      waiting_.push_back(std::move(part));
    IssueLocked();
  }

  // Replaces the fixed buffers once nothing is in flight on this ring.
  absl::Status RegisterBuffers(absl::Span<const iovec> buffers) {
    absl::MutexLock lock(&mu_);
    registering_ = true;
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &in_flight_));
    absl::Status status = ApplyRegistrationLocked(buffers);
    registering_ = false;
    IssueLocked();
    return status;
  }

  // Whether the calling thread is this ring's reaper of engine `engine_id`.
  static Ring* ReaperRingOfThisThread(uint64_t engine_id) {
    return reaper_ring_engine_ == engine_id ? reaper_ring_ : nullptr;
  }

  int64_t fixed_ios() const { return fixed_ios_.load(); }
  int most_buffered_reads() {
    absl::MutexLock lock(&mu_);
    return most_buffered_reads_;
  }

 private:
  Ring(int depth, int max_buffered_reads, uint64_t engine_id)
      : depth_(depth),
        max_buffered_reads_(max_buffered_reads),
        engine_id_(engine_id) {}

  static bool BufferedRead(const Part& part) {
    return part.op == IoRequest::Op::kRead && !part.file->direct();
  }

  absl::Status ApplyRegistrationLocked(absl::Span<const iovec> buffers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!registered_.empty()) io_uring_unregister_buffers(&ring_);
    registered_.clear();
    if (buffers.empty()) return absl::OkStatus();
    const int ret = io_uring_register_buffers(
        &ring_, buffers.data(), static_cast<unsigned>(buffers.size()));
    if (ret < 0) {
      return ErrnoError(
          -ret, absl::StrCat("io_uring_register_buffers (", buffers.size(),
                             " buffers); I/O continues without fixed "
                             "buffers"));
    }
    registered_.assign(buffers.begin(), buffers.end());
    return absl::OkStatus();
  }

  // Index of the registered buffer holding [data, data+length), or -1.
  int FixedIndex(const std::byte* data, size_t length) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < registered_.size(); ++i) {
      const auto* base = static_cast<const std::byte*>(registered_[i].iov_base);
      if (data >= base && data + length <= base + registered_[i].iov_len) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  void PrepLocked(Part* part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    const int fd = part->file->native_fd();
    std::byte* data = part->data + part->done;
    const unsigned length = static_cast<unsigned>(part->length - part->done);
    const uint64_t offset = static_cast<uint64_t>(part->offset + part->done);
    int fixed = -1;
    switch (part->op) {
      case IoRequest::Op::kWrite:
        fixed = FixedIndex(data, length);
        if (fixed >= 0) {
          io_uring_prep_write_fixed(sqe, fd, data, length, offset, fixed);
        } else {
          io_uring_prep_write(sqe, fd, data, length, offset);
        }
        part->uncached = part->file->uncached();
        if (part->uncached) sqe->rw_flags = kRwfDontCache;
        break;
      case IoRequest::Op::kRead:
        fixed = FixedIndex(data, length);
        if (fixed >= 0) {
          io_uring_prep_read_fixed(sqe, fd, data, length, offset, fixed);
        } else {
          io_uring_prep_read(sqe, fd, data, length, offset);
        }
        // No RWF_DONTCACHE: the file drops its read pages behind itself
        // (NoteRead below).
        part->uncached = false;
        break;
      case IoRequest::Op::kFsync:
        io_uring_prep_fsync(sqe, fd, 0);
        break;
      case IoRequest::Op::kWriteback:
        io_uring_prep_sync_file_range(sqe, fd, WritebackPiece(*part), offset,
                                      SYNC_FILE_RANGE_WRITE);
        break;
    }
    if (fixed >= 0) fixed_ios_.fetch_add(1, std::memory_order_relaxed);
    // A buffered read goes straight to a kernel worker, which reads with
    // blocking semantics, as the POSIX engine's threads do, instead of the
    // kernel first trying it without blocking, which cold loads pay for
    // (docs/BENCHMARKS.md section 1, "Buffered reads on io_uring").
    if (part->op == IoRequest::Op::kRead && !part->file->direct()) {
      io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
    }
    HandToKernel(part);
    io_uring_sqe_set_data(sqe, part);
  }

  // Moves waiting parts into the submission queue while the ring has room,
  // then enters the kernel. The submission queue is empty after each
  // io_uring_submit (the kernel consumes it synchronously), so a ring of
  // `depth_` entries always has an SQE for each of up to depth_ parts.
  // Buffered reads take at most max_buffered_reads_ of the depth: the
  // kernel's workers then read the parts of a file close to offset order,
  // which its read-ahead follows as a stream (docs/BENCHMARKS.md section 1,
  // "Buffered read sizes"). Parts keep their order: one that must wait holds
  // back those behind it.
  void IssueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (registering_) return;
    while (!waiting_.empty() && in_flight_ < depth_) {
      const bool buffered_read = BufferedRead(*waiting_.front());
      if (buffered_read && buffered_reads_ >= max_buffered_reads_) break;
      PrepLocked(waiting_.front().release());
      waiting_.pop_front();
      ++in_flight_;
      if (buffered_read) {
        ++buffered_reads_;
        most_buffered_reads_ = std::max(most_buffered_reads_, buffered_reads_);
      }
    }
    if (io_uring_sq_ready(&ring_) > 0) {
      // -EBUSY/-EAGAIN leave the entries queued; the reaper submits them
      // again after its next completions.
      io_uring_submit(&ring_);
    }
  }

  // The result of one completion: resubmit (short transfer, EINTR/EAGAIN)
  // or hand to CompletePart. Runs on the reaper without the mutex.
  void Complete(Part* raw, int res, std::vector<std::unique_ptr<Part>>& again) {
    std::unique_ptr<Part> part(raw);
    if (res == -EINTR || res == -EAGAIN) {
      again.push_back(std::move(part));
      return;
    }
    if (res == -EOPNOTSUPP && part->uncached) {
      // The kernel or the file system has no RWF_DONTCACHE: the file uses
      // the page cache as usual from now on, this transfer included.
      part->file->NoteUncachedRefused();
      again.push_back(std::move(part));
      return;
    }
    if (part->op == IoRequest::Op::kWriteback) {
      if (res < 0) {
        absl::Status status =
            WritebackStatus(-res, part->file->path(), part->offset + part->done,
                            part->length - part->done);
        if (!status.ok()) {
          CompletePart(std::move(part), std::move(status));
          return;
        }
        part->done = part->length;  // The file cannot: nothing more to do.
      } else {
        part->done += WritebackPiece(*part);
      }
      if (part->done < part->length) {
        again.push_back(std::move(part));  // The next piece.
        return;
      }
      CompletePart(std::move(part), size_t{0});
      return;
    }
    if (res < 0) {
      absl::Status error = ErrnoError(-res, PartContext(*part));
      CompletePart(std::move(part), std::move(error));
      return;
    }
    if (part->op == IoRequest::Op::kFsync) {
      CompletePart(std::move(part), size_t{0});
      return;
    }
    if (res == 0) {
      if (part->op == IoRequest::Op::kRead) {  // End of file.
        const size_t done = part->done;
        CompletePart(std::move(part), done);
      } else {
        absl::Status error = ErrnoError(
            EIO, absl::StrCat(PartContext(*part), ": wrote 0 bytes"));
        CompletePart(std::move(part), std::move(error));
      }
      return;
    }
    if (part->op == IoRequest::Op::kRead && !part->file->direct()) {
      part->file->NoteRead(part->offset + part->done, res);
    }
    part->done += static_cast<size_t>(res);
    if (part->done < part->length) {
      again.push_back(std::move(part));  // Short transfer: the remainder.
      return;
    }
    const size_t done = part->done;
    CompletePart(std::move(part), done);
  }

  void ReapLoop() {
    reaper_ring_ = this;
    reaper_ring_engine_ = engine_id_;
    std::vector<std::pair<uint64_t, int>> done;
    std::vector<std::unique_ptr<Part>> again;
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int ret = io_uring_wait_cqe(&ring_, &cqe);
      if (ret == -EINTR) continue;
      if (ret < 0) {  // Transient (-EAGAIN, -ETIME): wait again.
        std::this_thread::yield();
        continue;
      }
      done.clear();
      unsigned head;
      unsigned seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        done.emplace_back(io_uring_cqe_get_data64(cqe), cqe->res);
      }
      io_uring_cq_advance(&ring_, seen);
      bool stop_seen = false;
      int buffered_reads_done = 0;
      again.clear();
      for (const auto& [tag, res] : done) {
        if (tag == kStopTag) {
          stop_seen = true;
          continue;
        }
        Part* part = reinterpret_cast<Part*>(tag);
        TakeFromKernel(part);
        if (BufferedRead(*part)) ++buffered_reads_done;
        Complete(part, res, again);
      }
      absl::MutexLock lock(&mu_);
      in_flight_ -= static_cast<int>(done.size());
      buffered_reads_ -= buffered_reads_done;
      for (auto it = again.rbegin(); it != again.rend(); ++it) {
        waiting_.push_front(std::move(*it));  // Before newer work.
      }
      IssueLocked();
      if (stop_seen && stopping_ && in_flight_ == 0 && waiting_.empty()) {
        return;
      }
    }
  }

  io_uring ring_;
  bool initialized_ = false;
  const int depth_;
  const int max_buffered_reads_;
  const uint64_t engine_id_;
  std::thread reaper_;
  std::atomic<int64_t> fixed_ios_{0};

  absl::Mutex mu_;  // The submission side.
  std::deque<std::unique_ptr<Part>> waiting_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int buffered_reads_ ABSL_GUARDED_BY(mu_) = 0;  // Of in_flight_.
  int most_buffered_reads_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<iovec> registered_ ABSL_GUARDED_BY(mu_);
  bool registering_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  static thread_local Ring* reaper_ring_;
  static thread_local uint64_t reaper_ring_engine_;
};

thread_local Ring* Ring::reaper_ring_ = nullptr;
thread_local uint64_t Ring::reaper_ring_engine_ = 0;

// The rings of one engine and which are bound to a thread. Shared with the
// thread_local bindings (weakly), which return their ring when the thread
// exits.
class RingSet {
 public:
  RingSet(uint64_t engine_id, int depth, int max_buffered_reads, int max_rings)
      : engine_id_(engine_id),
        depth_(depth),
        max_buffered_reads_(max_buffered_reads),
        max_rings_(max_rings) {}

  uint64_t engine_id() const { return engine_id_; }

  absl::Status AddFirstRing() {
    absl::MutexLock lock(&mu_);
    DCP_ASSIGN_OR_RETURN(
        std::unique_ptr<Ring> ring,
        Ring::Create(depth_, max_buffered_reads_, engine_id_, registration_));
    rings_.push_back(std::move(ring));
    bound_.push_back(0);
    return absl::OkStatus();
  }

  // A ring for a thread that has none: an unbound one, a new one (up to
  // max_rings), or the least-bound one. Returns its index and the ring
  // (valid until Shutdown).
  std::pair<size_t, Ring*> Acquire() {
    absl::MutexLock lock(&mu_);
    size_t best = 0;
    for (size_t i = 0; i < rings_.size(); ++i) {
      if (bound_[i] < bound_[best]) best = i;
    }
    if (bound_[best] > 0 && static_cast<int>(rings_.size()) < max_rings_) {
      absl::StatusOr<std::unique_ptr<Ring>> ring =
          Ring::Create(depth_, max_buffered_reads_, engine_id_, registration_);
      if (ring.ok()) {  // Else share: the first ring proved io_uring works.
        rings_.push_back(*std::move(ring));
        bound_.push_back(0);
        best = rings_.size() - 1;
      }
    }
    ++bound_[best];
    return {best, rings_[best].get()};
  }

  void Release(size_t index) {
    absl::MutexLock lock(&mu_);
    if (index < bound_.size() && bound_[index] > 0) --bound_[index];
  }

  absl::Status RegisterBuffers(absl::Span<const iovec> buffers) {
    absl::MutexLock lock(&mu_);
    registration_.assign(buffers.begin(), buffers.end());
    absl::Status first;
    for (auto& ring : rings_) {
      absl::Status status = ring->RegisterBuffers(buffers);
      first.Update(status);
    }
    return first;
  }

  // Stops every ring's reaper (nothing may be in flight).
  void Shutdown() {
    std::vector<std::unique_ptr<Ring>> rings;
    {
      absl::MutexLock lock(&mu_);
      rings.swap(rings_);
      bound_.clear();
    }
    rings.clear();
  }

  int ring_count() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(rings_.size());
  }

  int64_t fixed_ios() {
    absl::MutexLock lock(&mu_);
    int64_t total = 0;
    for (auto& ring : rings_) total += ring->fixed_ios();
    return total;
  }

  int most_buffered_reads() {
    absl::MutexLock lock(&mu_);
    int most = 0;
    for (auto& ring : rings_)
      most = std::max(most, ring->most_buffered_reads());
    return most;
  }

 private:
  const uint64_t engine_id_;
  const int depth_;
  const int max_buffered_reads_;
  const int max_rings_;
  absl::Mutex mu_;
  // Rings are only added until Shutdown, so a Ring& stays valid meanwhile.
  std::vector<std::unique_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);
  std::vector<int> bound_ ABSL_GUARDED_BY(mu_);  // Threads bound per ring.
  std::vector<iovec> registration_ ABSL_GUARDED_BY(mu_);
};

// This thread's ring in each engine it has submitted to.
class ThreadRingBindings {
 public:
  ~ThreadRingBindings() {
    for (Binding& b : bindings_) {
      if (std::shared_ptr<RingSet> set = b.set.lock()) set->Release(b.index);
    }
  }

  Ring& RingFor(const std::shared_ptr<RingSet>& set) {
    for (Binding& b : bindings_) {
      if (b.engine_id == set->engine_id()) return *b.ring;
    }
    // Forget engines that are gone before adding one.
    std::erase_if(bindings_, [](const Binding& b) { return b.set.expired(); });
    auto [index, ring] = set->Acquire();
    bindings_.push_back({set->engine_id(), set, index, ring});
    return *ring;
  }

 private:
  struct Binding {
    uint64_t engine_id;
    std::weak_ptr<RingSet> set;
    size_t index;
    Ring* ring;  // Owned by `set`; used only while the engine lives.
  };
  std::vector<Binding> bindings_;
};

thread_local ThreadRingBindings thread_rings;

class UringIoEngine final : public IoEngineBase {
 public:
  explicit UringIoEngine(const IoEngineOptions& options)
      : IoEngineBase(options),
        rings_(std::make_shared<RingSet>(
            next_engine_id.fetch_add(1), std::max(4, options.queue_depth),
            std::max(1, options.max_buffered_reads_in_flight),
            std::max(1, options.max_rings))),
        helper_threads_(std::max(1, options.threads)) {}

  ~UringIoEngine() override {
    WaitIdle();
    rings_->Shutdown();
    helper_.reset();
  }

  // Creates the first ring: proves that io_uring works here.
  absl::Status Init() { return rings_->AddFirstRing(); }

  absl::string_view name() const override { return "io_uring"; }

  absl::Status RegisterBuffers(absl::Span<const iovec> buffers) override {
    return rings_->RegisterBuffers(buffers);
  }

  int ring_count() { return rings_->ring_count(); }
  int64_t fixed_ios() { return rings_->fixed_ios(); }
  int most_buffered_reads() { return rings_->most_buffered_reads(); }

 protected:
  void StartParts(std::vector<std::unique_ptr<Part>> parts) override {
    std::vector<std::unique_ptr<Part>> native;
    native.reserve(parts.size());
    for (std::unique_ptr<Part>& part : parts) {
      if (part->file->native_fd() < 0) {
        RunWithoutDescriptor(std::move(part));
      } else {
        native.push_back(std::move(part));
      }
    }
    if (native.empty()) return;
    Ring* ring = Ring::ReaperRingOfThisThread(rings_->engine_id());
    if (ring == nullptr) ring = &thread_rings.RingFor(rings_);
    ring->Submit(std::move(native));
  }

 private:
  void RunWithoutDescriptor(std::unique_ptr<Part> part) {
    std::call_once(helper_once_, [this] {
      helper_ = std::make_unique<ThreadPool>(helper_threads_);
    });
    helper_->Schedule([part = std::move(part)]() mutable {
      absl::StatusOr<size_t> result = RunPartWithFile(*part);
      CompletePart(std::move(part), std::move(result));
    });
  }

  std::shared_ptr<RingSet> rings_;
  const int helper_threads_;
  std::once_flag helper_once_;
  std::unique_ptr<ThreadPool> helper_;
};

}  // namespace

void SetUringSetupFailureForTest(int error_number) {
  forced_setup_error.store(error_number);
}

absl::StatusOr<UringStats> UringStatsForTest(IoEngine& engine) {
  auto* uring = dynamic_cast<UringIoEngine*>(&engine);
  if (uring == nullptr) {
    return absl::InvalidArgumentError("not an io_uring engine");
  }
  return UringStats{uring->ring_count(), uring->fixed_ios(),
                    uring->most_buffered_reads()};
}

}  // namespace internal_io

absl::StatusOr<std::unique_ptr<IoEngine>> NewUringIoEngine(
    const IoEngineOptions& options) {
  auto engine = std::make_unique<internal_io::UringIoEngine>(options);
  absl::Status status = engine->Init();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("io_uring set-up failed: ",
                                                    status.message()));
  }
  return engine;
}

}  // namespace dcp
