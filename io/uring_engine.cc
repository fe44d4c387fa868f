// The io_uring IoEngine (liburing). Each ring has one thread that both
// submits and reaps (so a ring is only ever touched by its own thread, and
// short transfers are resubmitted without locks). Other threads hand parts
// to a ring through a queue and wake its thread through an eventfd whose
// read is always pending on the ring.
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/executor.h"
#include "core/status.h"
#include "io/internal/io_engine_base.h"
#include "io/io_engine.h"

namespace dcp {
namespace internal_io {
namespace {

std::atomic<int> forced_setup_error{0};

// user_data of the eventfd read; parts use their address.
constexpr uint64_t kWakeTag = 1;

class Ring {
 public:
  static absl::StatusOr<std::unique_ptr<Ring>> Create(int depth) {
    auto ring = std::unique_ptr<Ring>(new Ring());
    if (int forced = forced_setup_error.load(); forced != 0) {
      return ErrnoError(forced, "io_uring_queue_init (forced by test)");
    }
    int ret =
        io_uring_queue_init(static_cast<unsigned>(depth), &ring->ring_, 0);
    if (ret < 0) {
      return ErrnoError(-ret,
                        absl::StrCat("io_uring_queue_init depth=", depth));
    }
    ring->initialized_ = true;
    ring->depth_ = depth;
    ring->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (ring->wake_fd_ < 0) return ErrnoError(errno, "eventfd");
    ring->thread_ = std::thread([r = ring.get()] { r->Loop(); });
    return ring;
  }

  ~Ring() {
    if (thread_.joinable()) {
      {
        absl::MutexLock lock(&mu_);
        stopping_ = true;
      }
      Wake();
      thread_.join();
    }
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  void Enqueue(std::vector<std::unique_ptr<Part>>& parts, size_t begin,
               size_t step) {
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = begin; i < parts.size(); i += step) {
        queue_.push_back(std::move(parts[i]));
      }
    }
    Wake();
  }

  absl::Status RegisterBuffers(absl::Span<const iovec> buffers) {
    absl::MutexLock lock(&mu_);
    pending_registration_.assign(buffers.begin(), buffers.end());
    registration_changed_ = true;
    return absl::OkStatus();
  }

 private:
  Ring() = default;

  void Wake() {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }

  void ArmWake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof(wake_value_), 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  // Index of the registered buffer holding [data, data+length), or -1.
  int FixedIndex(const std::byte* data, size_t length) const {
    for (size_t i = 0; i < registered_.size(); ++i) {
      const auto* base = static_cast<const std::byte*>(registered_[i].iov_base);
      if (data >= base && data + length <= base + registered_[i].iov_len) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  void Prep(Part* part) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    const int fd = part->file->native_fd();
    std::byte* data = part->data + part->done;
    const unsigned length = static_cast<unsigned>(part->length - part->done);
    const uint64_t offset = static_cast<uint64_t>(part->offset + part->done);
    switch (part->op) {
      case IoRequest::Op::kWrite:
        if (int fixed = FixedIndex(data, length); fixed >= 0) {
          io_uring_prep_write_fixed(sqe, fd, data, length, offset, fixed);
        } else {
          io_uring_prep_write(sqe, fd, data, length, offset);
        }
        break;
      case IoRequest::Op::kRead:
        if (int fixed = FixedIndex(data, length); fixed >= 0) {
          io_uring_prep_read_fixed(sqe, fd, data, length, offset, fixed);
        } else {
          io_uring_prep_read(sqe, fd, data, length, offset);
        }
        break;
      case IoRequest::Op::kFsync:
        io_uring_prep_fsync(sqe, fd, 0);
        break;
    }
    io_uring_sqe_set_data(sqe, part);
  }

  // Handles one completion of `part` with result `res`.
  void Complete(Part* raw, int res) {
    std::unique_ptr<Part> part(raw);
    --in_flight_;
    if (res == -EINTR || res == -EAGAIN) {
      retry_.push_back(std::move(part));
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
    part->done += static_cast<size_t>(res);
    if (part->done < part->length) {
      retry_.push_back(std::move(part));  // Short transfer: the remainder.
      return;
    }
    const size_t done = part->done;
    CompletePart(std::move(part), done);
  }

  void ApplyRegistration() {
    // Only with nothing in flight but the wake read (the kernel quiesces the
    // ring for registration anyway).
    if (!registered_.empty()) io_uring_unregister_buffers(&ring_);
    registered_.clear();
    if (!next_registration_.empty() &&
        io_uring_register_buffers(&ring_, next_registration_.data(),
                                  next_registration_.size()) == 0) {
      registered_ = next_registration_;
    }
  }

  void Loop() {
    ArmWake();
    io_uring_submit(&ring_);
    bool stopping = false;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        stopping = stopping_;
        while (!queue_.empty()) {
          retry_.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        if (registration_changed_) {
          next_registration_ = std::move(pending_registration_);
          pending_registration_.clear();
          registration_changed_ = false;
          apply_registration_ = true;
        }
      }
      if (apply_registration_ && in_flight_ == 0) {
        ApplyRegistration();
        apply_registration_ = false;
      }
      // Parts whose files have no descriptor run on a helper thread.
      while (!retry_.empty() && in_flight_ < depth_ - 1 &&
             !apply_registration_) {
        std::unique_ptr<Part> part = std::move(retry_.front());
        retry_.pop_front();
        if (part->file->native_fd() < 0) {
          RunWithoutDescriptor(std::move(part));
          continue;
        }
        Prep(part.release());
        ++in_flight_;
      }
      if (stopping && in_flight_ == 0 && retry_.empty()) return;
      io_uring_submit_and_wait(&ring_, 1);
      io_uring_cqe* cqe;
      unsigned head;
      unsigned seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        if (io_uring_cqe_get_data64(cqe) == kWakeTag) {
          ArmWake();
          continue;
        }
        Complete(static_cast<Part*>(io_uring_cqe_get_data(cqe)), cqe->res);
      }
      io_uring_cq_advance(&ring_, seen);
    }
  }

  void RunWithoutDescriptor(std::unique_ptr<Part> part) {
    if (helper_ == nullptr) helper_ = std::make_unique<ThreadPool>(1);
    helper_->Schedule([part = std::move(part)]() mutable {
      absl::StatusOr<size_t> result = RunPartWithFile(*part);
      CompletePart(std::move(part), std::move(result));
    });
  }

  io_uring ring_;
  bool initialized_ = false;
  int depth_ = 0;
  int wake_fd_ = -1;
  uint64_t wake_value_ = 0;
  std::thread thread_;
  // Ring-thread state.
  int in_flight_ = 0;
  std::deque<std::unique_ptr<Part>> retry_;
  std::vector<iovec> registered_;
  std::vector<iovec> next_registration_;
  bool apply_registration_ = false;
  std::unique_ptr<ThreadPool> helper_;
  // Shared with submitters.
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Part>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<iovec> pending_registration_ ABSL_GUARDED_BY(mu_);
  bool registration_changed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

class UringIoEngine final : public IoEngineBase {
 public:
  explicit UringIoEngine(const IoEngineOptions& options)
      : IoEngineBase(options.max_transfer) {}
  ~UringIoEngine() override {
    WaitIdle();
    rings_.clear();
  }

  absl::Status Init(const IoEngineOptions& options) {
    const int rings = std::max(1, options.threads);
    const int depth = std::max(4, options.queue_depth);
    for (int i = 0; i < rings; ++i) {
      DCP_ASSIGN_OR_RETURN(std::unique_ptr<Ring> ring, Ring::Create(depth));
      rings_.push_back(std::move(ring));
    }
    return absl::OkStatus();
  }

  absl::string_view name() const override { return "io_uring"; }

  absl::Status RegisterBuffers(absl::Span<const iovec> buffers) override {
    for (auto& ring : rings_)
      DCP_RETURN_IF_ERROR(ring->RegisterBuffers(buffers));
    return absl::OkStatus();
  }

 protected:
  void StartParts(std::vector<std::unique_ptr<Part>> parts) override {
    // Spread the batch over the rings, starting where the last batch ended.
    const size_t n = rings_.size();
    const size_t start = next_ring_.fetch_add(1) % n;
    const size_t used = std::min(n, parts.size());
    for (size_t k = 0; k < used; ++k) {
      rings_[(start + k) % n]->Enqueue(parts, k, used);
    }
  }

 private:
  std::vector<std::unique_ptr<Ring>> rings_;
  std::atomic<size_t> next_ring_{0};
};

}  // namespace

void SetUringSetupFailureForTest(int error_number) {
  forced_setup_error.store(error_number);
}

}  // namespace internal_io

absl::StatusOr<std::unique_ptr<IoEngine>> NewUringIoEngine(
    const IoEngineOptions& options) {
  auto engine = std::make_unique<internal_io::UringIoEngine>(options);
  absl::Status status = engine->Init(options);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("io_uring set-up failed: ",
                                                    status.message()));
  }
  return engine;
}

}  // namespace dcp
