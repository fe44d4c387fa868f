#include "io/internal/sequential_writer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <utility>

#include "io/internal/parallel_work.h"

namespace dcp::internal_io {
namespace {

// Ranges shorter than this are gathered even when they could be written
// from their own memory: one request per tiny tensor costs more than the
// copy.
constexpr int64_t kMinStraightWrite = int64_t{64} << 10;

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kDirectIoAlignment == 0;
}

}  // namespace

// A kDirectIoAlignment aligned bounce chunk and the write that reads it.
struct SequentialWriter::Bounce : AlignedBuffer {
  explicit Bounce(int64_t size_in)
      : AlignedBuffer(static_cast<size_t>(size_in)) {}
  Future<size_t> write;
};

SequentialWriter::SequentialWriter(IoEngine& engine, File& file,
                                   SequentialWriterOptions options)
    : engine_(engine),
      file_(file),
      options_(options),
      failed_(std::make_shared<std::atomic<bool>>(false)) {}

SequentialWriter::~SequentialWriter() {
  for (Future<size_t>& write : writes_) write.Wait();
}

Future<size_t> SequentialWriter::Submit(int64_t offset, const std::byte* data,
                                        int64_t length,
                                        std::shared_ptr<void> keepalive) {
  Future<size_t> write = engine_.Submit(
      {IoRequest::Write(&file_, offset, data, static_cast<size_t>(length))})[0];
  write.OnReady([failed = failed_, keep = std::move(keepalive)](
                    const absl::StatusOr<size_t>& result) mutable {
    if (!result.ok()) failed->store(true);
    keep.reset();
  });
  writes_.push_back(write);
  submitted_end_ = std::max(submitted_end_, offset + length);
  if (options_.writeback_bytes > 0 && !options_.direct &&
      submitted_end_ - written_back_ >= options_.writeback_bytes) {
    // Started after the writes before it (engine ordering).
    writebacks_.push_back(engine_.Submit({IoRequest::Writeback(
        &file_, written_back_,
        static_cast<size_t>(submitted_end_ - written_back_))})[0]);
    writes_.push_back(writebacks_.back());
    written_back_ = submitted_end_;
    while (writebacks_.size() > 2) {
      writebacks_.front().Wait();  // Its error is seen with the others.
      writebacks_.pop_front();
    }
  }
  return write;
}

void SequentialWriter::FlushBounce(int64_t length) {
  if (open_ == nullptr) return;
  if (length > 0) {
    open_->write = Submit(open_start_, open_->data, length, nullptr);
    in_flight_.push_back(std::move(open_));
  } else {
    bounce_bytes_ -= open_->size;
  }
  open_.reset();
  open_fill_ = 0;
}

absl::Status SequentialWriter::FirstError() {
  if (!failed_->load()) return absl::OkStatus();
  for (Future<size_t>& write : writes_) {
    const absl::StatusOr<size_t>& result = write.Wait();
    if (!result.ok()) return result.status();
  }
  return absl::OkStatus();
}

absl::Status SequentialWriter::Append(const std::byte* data, int64_t length,
                                      std::shared_ptr<void> keepalive) {
  if (failed_->load()) return FirstError();
  const bool direct = options_.direct;
  while (length > 0) {
    // With O_DIRECT, memory whose alignment matches the file's can be
    // written in place from the next block boundary on: top the bounce
    // chunk up to that boundary first.
    if (open_ != nullptr && direct &&
        (reinterpret_cast<uintptr_t>(data) - position_) % kDirectIoAlignment ==
            0) {
      const int64_t to_boundary =
          AlignUp(position_, kDirectIoAlignment) - position_;
      if (length - to_boundary >= kMinStraightWrite) {
        std::memcpy(open_->data + open_fill_, data, to_boundary);
        open_fill_ += to_boundary;
        position_ += to_boundary;
        data += to_boundary;
        length -= to_boundary;
        FlushBounce(open_fill_);
      }
    }
    if (open_ == nullptr && length >= kMinStraightWrite &&
        (!direct || (position_ % kDirectIoAlignment == 0 && Aligned(data)))) {
      const int64_t body =
          direct ? AlignDown(length, kDirectIoAlignment) : length;
      if (keepalive != nullptr && options_.max_kept_bytes > 0) {
        while (!kept_.empty() &&
               (kept_bytes_ + body > options_.max_kept_bytes ||
                kept_.front().write.ready())) {
          kept_.front().write.Wait();  // Its error is seen with the others.
          kept_bytes_ -= kept_.front().bytes;
          kept_.pop_front();
        }
        kept_.push_back(
            {Submit(position_, data, body, nullptr), body, keepalive});
        kept_bytes_ += body;
      } else {
        Submit(position_, data, body, keepalive);
      }
      position_ += body;
      data += body;
      length -= body;
      continue;
    }
    if (open_ == nullptr) {
      // Free the oldest chunks once their writes are done (waiting for
      // them past the budget): memory stays bounded.
      while (!in_flight_.empty() &&
             (bounce_bytes_ + options_.chunk_bytes > options_.bounce_budget ||
              in_flight_.front()->write.ready())) {
        in_flight_.front()->write.Wait();
        bounce_bytes_ -= in_flight_.front()->size;
        in_flight_.pop_front();
      }
      if (failed_->load()) return FirstError();
      open_ = std::make_unique<Bounce>(options_.chunk_bytes);
      bounce_bytes_ += open_->size;
      open_start_ = position_;  // Block aligned (see FlushBounce's callers).
      open_fill_ = 0;
    }
    const int64_t n = std::min(length, open_->size - open_fill_);
    std::memcpy(open_->data + open_fill_, data, n);
    open_fill_ += n;
    position_ += n;
    data += n;
    length -= n;
    if (open_fill_ == open_->size) FlushBounce(open_fill_);
  }
  return absl::OkStatus();
}

absl::Status SequentialWriter::Finish() {
  finished_ = true;
  if (open_ != nullptr && !failed_->load()) {
    int64_t length = open_fill_;
    if (options_.direct) {
      length = AlignUp(open_fill_, kDirectIoAlignment);
      std::memset(open_->data + open_fill_, 0, length - open_fill_);
    }
    FlushBounce(length);
  }
  absl::Status status;
  for (Future<size_t>& write : writes_) {
    const absl::StatusOr<size_t>& result = write.Wait();
    if (!result.ok()) status.Update(result.status());
  }
  in_flight_.clear();
  kept_.clear();
  kept_bytes_ = 0;
  open_.reset();
  bounce_bytes_ = 0;
  if (status.ok() && options_.direct && position_ % kDirectIoAlignment != 0) {
    status = file_.Truncate(position_);
  }
  return status;
}

}  // namespace dcp::internal_io
