#include "io/fs_file_writer.h"

#include <unistd.h>

#include <cstddef>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

// Completes writes only when the test says so.
class HoldingEngine : public IoEngine {
 public:
  absl::string_view name() const override { return "holding"; }
  std::vector<Future<size_t>> Submit(
      absl::Span<const IoRequest> batch) override {
    std::vector<Future<size_t>> futures;
    for (const IoRequest& r : batch) {
      held.emplace_back();
      lengths.push_back(r.length);
      futures.push_back(held.back().future());
    }
    return futures;
  }
  void CompleteAll() {
    for (size_t i = 0; i < held.size(); ++i) held[i].Set(lengths[i]);
  }

  std::vector<Promise<size_t>> held;
  std::vector<size_t> lengths;
};

TEST(FileWriteQueue, WrittenBounceBuffersAreReusedInFlightOnesAreNot) {
  HoldingEngine engine;
  std::unique_ptr<File> file = AnyFile();
  FileWriteQueue queue(engine, *file, 0);
  internal_io::AlignedBuffer* first = queue.TakeBounce(100 << 10);
  EXPECT_GE(first->size, 100 << 10);
  queue.SetBounceWritten(queue.Write(0, 0, first->data, 100 << 10));
  // In flight: a second buffer.
  internal_io::AlignedBuffer* second = queue.TakeBounce(120 << 10);
  EXPECT_NE(second->data, first->data);
  queue.SetBounceWritten(queue.Write(1, 128 << 10, second->data, 120 << 10));
  engine.CompleteAll();
  // Both written: the next buffers of their capacity are the same memory,
  // one of another capacity is not.
  std::byte* const first_data = first->data;
  std::byte* const second_data = second->data;
  internal_io::AlignedBuffer* third = queue.TakeBounce(64 << 10);
  EXPECT_NE(third->data, first_data);
  EXPECT_NE(third->data, second_data);
  queue.SetBounceWritten(queue.Write(2, 256 << 10, third->data, 64 << 10));
  internal_io::AlignedBuffer* fourth = queue.TakeBounce(99 << 10);
  EXPECT_EQ(fourth->data, first_data);
  queue.SetBounceWritten(queue.Write(3, 320 << 10, fourth->data, 99 << 10));
  engine.CompleteAll();
  EXPECT_TRUE(queue.Finish(0, [](size_t) { return std::string(); }).ok());
}

// Resolves item i to `values[i]` bytes of `fill[i]`.
class BytesPlanner : public SavePlanner {
 public:
  absl::Status SetUp(const StateDict&, const StorageMeta&, bool) override {
    return absl::OkStatus();
  }
  absl::StatusOr<SavePlan> CreateLocalPlan() override { return SavePlan{}; }
  absl::StatusOr<std::pair<std::vector<SavePlan>, Metadata>> CreateGlobalPlan(
      std::vector<SavePlan> plans) override {
    return std::make_pair(std::move(plans), Metadata{});
  }
  absl::StatusOr<SavePlan> FinishPlan(SavePlan plan) override { return plan; }
  absl::StatusOr<WriteValue> ResolveData(const WriteItem& item) override {
    return WriteValue(values.at(item.index.fqn));
  }

  std::map<std::string, std::string> values;
};

// Small items share packs written from reused buffers: every byte between
// and after the items in a pack reads as zero, whatever the buffer held
// before (packs of 0xAB items precede a pack of 0x11 items).
TEST(WriteDataFile, PackGapsAreZeroInReusedBuffers) {
  for (bool direct : {false, true}) {
    const std::string dir = ::testing::TempDir();
    const std::string name = absl::StrCat("packs_", direct);
    ::unlink(JoinPath(dir, name).c_str());
    absl::StatusOr<std::unique_ptr<IoEngine>> engine = NewIoEngine();
    ASSERT_TRUE(engine.ok()) << engine.status();
    BytesPlanner planner;
    std::vector<WriteItem> items;
    for (int i = 0; i < 100; ++i) {
      WriteItem item;
      item.index = MetadataIndex(absl::StrCat("v", 100 + i));
      item.type = WriteItemType::kBytesIO;
      // 60,000 bytes: 32 bytes of gap to the next 64-byte boundary; 17
      // items fill a 1 MiB pack.
      const int64_t length = i < 60 ? 60000 : 1000 + i;
      item.bytes_io_data = BytesIOWriteData{length};
      planner.values[item.index.fqn] =
          std::string(length, i < 60 ? '\xab' : '\x11');
      items.push_back(item);
    }
    std::vector<const WriteItem*> item_ptrs;
    std::vector<WriteResult> results(items.size());
    std::vector<WriteResult*> result_ptrs;
    for (size_t i = 0; i < items.size(); ++i) {
      item_ptrs.push_back(&items[i]);
      result_ptrs.push_back(&results[i]);
    }
    DataFileContext context;
    context.fs = &LocalFileSystem();
    context.engine = engine->get();
    context.dir = dir;
    context.direct_io = direct;
    context.uncached_writes = false;
    context.sync_files = false;
    context.checksum_block_size = 1 << 20;
    context.record_created = [](const std::string&) {};
    ASSERT_TRUE(
        WriteDataFile(context, name, item_ptrs, planner, result_ptrs).ok());
    std::ifstream in(JoinPath(dir, name), std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    std::string expected(file.size(), '\0');
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string& value = planner.values[items[i].index.fqn];
      ASSERT_LE(results[i].storage_data.offset + value.size(), file.size());
      expected.replace(results[i].storage_data.offset, value.size(), value);
    }
    EXPECT_GT(results[99].storage_data.offset, int64_t{3} << 20);
    EXPECT_TRUE(file == expected) << "direct=" << direct;
  }
}

}  // namespace
}  // namespace dcp::internal_fs
