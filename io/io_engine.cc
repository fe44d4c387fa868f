#include "io/io_engine.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/executor.h"
#include "core/status.h"
#include "io/internal/io_engine_base.h"

namespace dcp {
namespace internal_io {
namespace {

std::atomic<bool> fallback_notice_printed{false};

const char* OpName(IoRequest::Op op) {
  switch (op) {
    case IoRequest::Op::kWrite:
      return "pwrite";
    case IoRequest::Op::kRead:
      return "pread";
    case IoRequest::Op::kFsync:
      return "fsync";
    case IoRequest::Op::kWriteback:
      return "sync_file_range";
  }
  return "io";
}

}  // namespace

bool FallbackNoticePrinted() { return fallback_notice_printed.load(); }

std::string PartContext(const Part& part) {
  if (part.op == IoRequest::Op::kFsync) {
    return absl::StrCat("fsync ", part.file->path());
  }
  return absl::StrCat(OpName(part.op), " ", part.file->path(),
                      " offset=", part.offset + part.done,
                      " length=", part.length - part.done);
}

absl::StatusOr<size_t> RunPartWithFile(const Part& part) {
  File& file = *part.file;
  switch (part.op) {
    case IoRequest::Op::kWrite:
      DCP_RETURN_IF_ERROR(
          file.PWrite(part.offset + part.done,
                      {part.data + part.done, part.length - part.done}));
      return part.length;
    case IoRequest::Op::kRead: {
      DCP_ASSIGN_OR_RETURN(size_t n, file.PRead(part.offset + part.done,
                                                {part.data + part.done,
                                                 part.length - part.done}));
      return part.done + n;
    }
    case IoRequest::Op::kFsync:
      DCP_RETURN_IF_ERROR(file.Sync());
      return 0;
    case IoRequest::Op::kWriteback:
      DCP_RETURN_IF_ERROR(
          file.StartWriteback(part.offset, static_cast<int64_t>(part.length)));
      return 0;
  }
  return absl::InternalError("unknown I/O op");
}

std::vector<Future<size_t>> IoEngineBase::Submit(
    absl::Span<const IoRequest> batch) {
  std::vector<Future<size_t>> futures;
  futures.reserve(batch.size());
  std::vector<std::unique_ptr<Part>> parts;
  for (const IoRequest& request : batch) {
    auto state = std::make_shared<RequestState>();
    state->engine = this;
    futures.push_back(state->promise.future());
    {
      absl::MutexLock lock(&mu_);
      ++in_flight_;
    }
    auto make_part = [&](int64_t offset, std::byte* data, size_t length) {
      auto part = std::make_unique<Part>();
      part->op = request.op;
      part->file = request.file;
      part->offset = offset;
      part->data = data;
      part->length = length;
      part->request = state;
      return part;
    };
    if (request.op == IoRequest::Op::kFsync ||
        request.op == IoRequest::Op::kWriteback) {
      const bool fsync = request.op == IoRequest::Op::kFsync;
      state->parts_left = 1;
      // A writeback is one part (the io_uring engine issues it in pieces
      // its 32-bit length field can hold).
      std::unique_ptr<Part> part =
          fsync ? make_part(0, nullptr, 0)
                : make_part(request.offset, nullptr, request.length);
      if (!fsync && request.length == 0) {
        CompletePart(std::move(part), size_t{0});  // Nothing to write back.
        continue;
      }
      std::vector<Future<size_t>> before;
      {
        absl::MutexLock lock(&mu_);
        PendingWrites& pending = pending_writes_[request.file];
        for (const Future<size_t>& f : pending.writes) {
          if (!f.ready()) before.push_back(f);
        }
        if (fsync) {
          // Later fsyncs wait for this one, which waits for these writes.
          pending.writes.clear();
          pending.writes.push_back(futures.back());
          pending.prune_at = PendingWrites::kFirstPrune;
        }
      }
      if (before.empty()) {
        parts.push_back(std::move(part));
      } else {
        std::shared_ptr<Part> held(part.release());
        WhenAll(before).OnReady([this, held](const absl::Status& writes) {
          auto ready = std::make_unique<Part>(std::move(*held));
          if (!writes.ok()) {
            // Not issued: an fsync would make a file with a hole durable.
            absl::Status aborted = absl::AbortedError(absl::StrCat(
                PartContext(*ready),
                " not issued: an earlier write to the file failed: ",
                writes.message()));
            CompletePart(std::move(ready), std::move(aborted));
            return;
          }
          std::vector<std::unique_ptr<Part>> one;
          one.push_back(std::move(ready));
          StartParts(std::move(one));
        });
      }
      continue;
    }
    // Buffered reads in max_buffered_read parts (max_transfer unless set),
    // the rest in max_transfer.
    const size_t max =
        request.op == IoRequest::Op::kRead && !request.file->direct()
            ? max_buffered_read_
            : max_transfer_;
    const size_t count =
        request.length == 0 ? 1 : (request.length + max - 1) / max;
    state->parts_left = count;
    for (size_t i = 0; i < count; ++i) {
      const size_t start = i * max;
      parts.push_back(make_part(request.offset + static_cast<int64_t>(start),
                                request.data + start,
                                std::min(max, request.length - start)));
    }
    if (request.op == IoRequest::Op::kWrite) {
      absl::MutexLock lock(&mu_);
      if (pending_writes_.size() >= prune_files_at_) {
        // Forget files whose every tracked write has completed (closed
        // files' entries would otherwise accumulate).
        absl::erase_if(pending_writes_, [](const auto& entry) {
          return std::all_of(entry.second.writes.begin(),
                             entry.second.writes.end(),
                             [](const Future<size_t>& f) { return f.ready(); });
        });
        prune_files_at_ = std::max<size_t>(256, 2 * pending_writes_.size());
      }
      PendingWrites& pending = pending_writes_[request.file];
      if (pending.writes.size() >= pending.prune_at) {
        std::erase_if(pending.writes,
                      [](const Future<size_t>& f) { return f.ready(); });
        pending.prune_at =
            std::max(PendingWrites::kFirstPrune, 2 * pending.writes.size());
      }
      pending.writes.push_back(futures.back());
    }
  }
  if (!parts.empty()) StartParts(std::move(parts));
  return futures;
}

void CompletePart(std::unique_ptr<Part> part, absl::StatusOr<size_t> result) {
  RequestState& state = *part->request;
  if (result.ok()) {
    state.transferred += *result;
  } else {
    absl::MutexLock lock(&state.mu);
    if (state.error.ok()) state.error = result.status();
  }
  if (state.parts_left.fetch_sub(1) != 1) return;
  std::shared_ptr<RequestState> keep = std::move(part->request);
  part.reset();
  absl::Status error;
  {
    absl::MutexLock lock(&keep->mu);
    error = keep->error;
  }
  IoEngineBase* engine = keep->engine;
  if (error.ok()) {
    keep->promise.Set(keep->transferred.load());
  } else {
    keep->promise.Set(std::move(error));
  }
  engine->RequestDone();
}

void IoEngineBase::RequestDone() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void IoEngineBase::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* n) { return *n == 0; }, &in_flight_));
  pending_writes_.clear();
}

namespace {

// Buffered writes to one file run one at a time, in submission order, on
// one worker at a time: parallel pwrites into one file's page cache contend
// on its inode lock (ext4 takes it exclusively for every buffered write), so
// 8 workers wrote a 4 GiB buffered file slower than 1 (docs/BENCHMARKS.md
// section 1, "Buffered writes per file on the POSIX engine"). io_uring's
// kernel workers run the buffered writes of one inode one at a time too.
// Different files still run in parallel, and O_DIRECT writes, reads, fsyncs
// and writebacks use every worker.
//
// Buffered reads go out in max_transfer parts (1 MiB) that the workers take
// in offset order (IoEngineOptions::max_buffered_read).
class PosixIoEngine final : public IoEngineBase {
 public:
  explicit PosixIoEngine(const IoEngineOptions& options)
      : IoEngineBase(options), pool_(std::max(1, options.threads)) {}
  ~PosixIoEngine() override { WaitIdle(); }

  absl::string_view name() const override { return "posix"; }

 protected:
  void StartParts(std::vector<std::unique_ptr<Part>> parts) override {
    for (std::unique_ptr<Part>& part : parts) {
      if (part->op == IoRequest::Op::kWrite && !part->file->direct()) {
        File* file = part->file;
        bool idle;
        {
          absl::MutexLock lock(&serial_mu_);
          std::deque<std::unique_ptr<Part>>& queue = serial_[file];
          idle = queue.empty();
          queue.push_back(std::move(part));
        }
        if (idle) pool_.Schedule([this, file] { DrainFile(file); });
        continue;
      }
      pool_.Schedule([part = std::move(part)]() mutable {
        absl::StatusOr<size_t> result = RunPartWithFile(*part);
        CompletePart(std::move(part), std::move(result));
      });
    }
  }

 private:
  // Runs `file`'s queued buffered writes until its queue is empty. The part
  // being written stays at the front of the queue, so a write submitted
  // meanwhile (from any thread, a completion callback included) joins the
  // queue instead of starting a second drain.
  void DrainFile(File* file) {
    for (;;) {
      Part* front;
      {
        absl::MutexLock lock(&serial_mu_);
        front = serial_[file].front().get();
      }
      absl::StatusOr<size_t> result = RunPartWithFile(*front);
      std::unique_ptr<Part> done;
      bool more;
      {
        absl::MutexLock lock(&serial_mu_);
        auto it = serial_.find(file);
        done = std::move(it->second.front());
        it->second.pop_front();
        more = !it->second.empty();
        if (!more) serial_.erase(it);
      }
      CompletePart(std::move(done), std::move(result));
      if (!more) return;
    }
  }

  absl::Mutex serial_mu_;
  // Buffered writes per file: the front is being written, the rest wait.
  absl::flat_hash_map<File*, std::deque<std::unique_ptr<Part>>> serial_
      ABSL_GUARDED_BY(serial_mu_);
  ThreadPool pool_;
};

}  // namespace

void NoteFallback(const absl::Status& why) {
  if (!fallback_notice_printed.exchange(true)) {
    std::fprintf(stderr,
                 "dcp: io_uring is unavailable (%s); using the POSIX I/O "
                 "engine\n",
                 std::string(why.message()).c_str());
  }
}

}  // namespace internal_io

absl::Status SubmitAndWait(IoEngine& engine, absl::Span<const IoRequest> batch,
                           std::vector<size_t>* transferred) {
  std::vector<Future<size_t>> futures = engine.Submit(batch);
  absl::Status first;
  if (transferred != nullptr) transferred->assign(futures.size(), 0);
  for (size_t i = 0; i < futures.size(); ++i) {
    const absl::StatusOr<size_t>& result = futures[i].Wait();
    if (!result.ok()) {
      first.Update(result.status());
    } else if (transferred != nullptr) {
      (*transferred)[i] = *result;
    }
  }
  return first;
}

absl::StatusOr<IoMode> ParseIoMode(absl::string_view text) {
  if (text == "auto") return IoMode::kAuto;
  if (text == "uring" || text == "io_uring") return IoMode::kUring;
  if (text == "posix") return IoMode::kPosix;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown I/O mode '", text, "' (auto, uring or posix)"));
}

absl::string_view IoModeName(IoMode mode) {
  switch (mode) {
    case IoMode::kAuto:
      return "auto";
    case IoMode::kUring:
      return "uring";
    case IoMode::kPosix:
      return "posix";
  }
  return "?";
}

std::unique_ptr<IoEngine> NewPosixIoEngine(const IoEngineOptions& options) {
  return std::make_unique<internal_io::PosixIoEngine>(options);
}

absl::StatusOr<std::unique_ptr<IoEngine>> NewIoEngine(
    const IoEngineOptions& options) {
  switch (options.mode) {
    case IoMode::kPosix:
      return NewPosixIoEngine(options);
    case IoMode::kUring:
      return NewUringIoEngine(options);
    case IoMode::kAuto: {
      absl::StatusOr<std::unique_ptr<IoEngine>> uring =
          NewUringIoEngine(options);
      if (uring.ok()) return uring;
      internal_io::NoteFallback(uring.status());
      return NewPosixIoEngine(options);
    }
  }
  return absl::InvalidArgumentError("unknown I/O mode");
}

}  // namespace dcp
