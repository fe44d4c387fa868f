#include "io/fs_file_writer.h"

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/io_engine.h"

namespace dcp::internal_fs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records every request and completes it at once: OK with its full length,
// or `fail_at`'s error for the write at that offset.
class RecordingEngine : public IoEngine {
 public:
  struct Recorded {
    IoRequest::Op op;
    int64_t offset;
    size_t length;
    friend bool operator==(const Recorded&, const Recorded&) = default;
  };

  absl::string_view name() const override { return "recording"; }
  std::vector<Future<size_t>> Submit(
      absl::Span<const IoRequest> batch) override {
    std::vector<Future<size_t>> futures;
    for (const IoRequest& r : batch) {
      recorded.push_back({r.op, r.offset, r.length});
      if (r.op == IoRequest::Op::kWrite && r.offset == fail_at) {
        futures.push_back(Future<size_t>::Ready(
            absl::ResourceExhaustedError("pwrite: no space left")));
      } else {
        futures.push_back(Future<size_t>::Ready(
            r.op == IoRequest::Op::kWrite ? r.length : size_t{0}));
      }
    }
    return futures;
  }

  std::vector<Recorded> recorded;
  int64_t fail_at = -1;
};

using Op = IoRequest::Op;
using Recorded = RecordingEngine::Recorded;

// A File the queue only names in its requests.
std::unique_ptr<File> AnyFile() {
  absl::StatusOr<std::unique_ptr<File>> file = LocalFileSystem().OpenForWrite(
      JoinPath(::testing::TempDir(), "fs_file_writer_test"), [] {
        OpenOptions o;
        o.exclusive = false;
        return o;
      }());
  EXPECT_TRUE(file.ok()) << file.status();
  return *std::move(file);
}

TEST(FileWriteQueue, WritesAreCutAtWritebackBoundariesAndFollowedByWriteback) {
  RecordingEngine engine;
  std::unique_ptr<File> file = AnyFile();
  std::vector<std::byte> data(40 << 10);
  {
    FileWriteQueue queue(engine, *file, /*writeback_bytes=*/16 << 10);
    queue.Write(0, 0, data.data(), 40 << 10);
    queue.Write(1, 40 << 10, data.data(), 8 << 10);
    queue.Fsync();
    EXPECT_TRUE(queue.Finish(0, [](size_t) { return std::string(); }).ok());
  }
  EXPECT_THAT(engine.recorded,
              ElementsAre(Recorded{Op::kWrite, 0, 16 << 10},
                          Recorded{Op::kWriteback, 0, 16 << 10},
                          Recorded{Op::kWrite, 16 << 10, 16 << 10},
                          Recorded{Op::kWriteback, 16 << 10, 16 << 10},
                          Recorded{Op::kWrite, 32 << 10, 8 << 10},
                          // The second item completes the third piece.
                          Recorded{Op::kWrite, 40 << 10, 8 << 10},
                          Recorded{Op::kWriteback, 32 << 10, 16 << 10},
                          Recorded{Op::kFsync, 0, 0}));
}

TEST(FileWriteQueue, WithoutWritebackEachWriteIsOneRequest) {
  RecordingEngine engine;
  std::unique_ptr<File> file = AnyFile();
  std::vector<std::byte> data(40 << 10);
  FileWriteQueue queue(engine, *file, /*writeback_bytes=*/0);
  queue.Write(0, 4096, data.data(), data.size());
  EXPECT_THAT(engine.recorded,
              ElementsAre(Recorded{Op::kWrite, 4096, 40 << 10}));
}

TEST(FileWriteQueue, TheFirstFailedWriteIsStickyAndNamesItsItem) {
  RecordingEngine engine;
  engine.fail_at = 8192;
  std::unique_ptr<File> file = AnyFile();
  std::vector<std::byte> data(4096);
  FileWriteQueue queue(engine, *file, 0);
  queue.Write(0, 0, data.data(), 4096);
  EXPECT_FALSE(queue.failed());
  queue.Write(1, 8192, data.data(), 4096);
  EXPECT_TRUE(queue.failed());
  queue.Write(2, 16384, data.data(), 4096);
  const std::vector<std::string> names = {"a", "model.w", "c"};
  absl::Status status =
      queue.Finish(3, [&](size_t item) { return names[item]; });
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("rank 3: writing model.w"));
}

TEST(FileWriteQueue, BounceBuffersAreAlignedAndBoundedByTheBudget) {
  RecordingEngine engine;
  std::unique_ptr<File> file = AnyFile();
  FileWriteQueue queue(engine, *file, 0);
  // More than the budget in total: older buffers are freed once written.
  for (int i = 0; i < 3 * kBounceBudget / kBounceChunk; ++i) {
    internal_io::AlignedBuffer* buffer = queue.TakeBounce(kBounceChunk);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data) %
                  internal_io::kDirectIoAlignment,
              0u);
    queue.SetBounceWritten(
        queue.Write(i, i * kBounceChunk, buffer->data, kBounceChunk));
  }
  EXPECT_TRUE(queue.Finish(0, [](size_t) { return std::string(); }).ok());
}

}  // namespace
}  // namespace dcp::internal_fs
