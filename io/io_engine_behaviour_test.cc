// Engine-specific behaviour beyond the conformance suite (io_engine_test.cc):
// io_uring's ring per submitting thread and its caps, the defaults' read
// parts, the POSIX engine's write order, uncached I/O, IoMode parsing and the
// automatic fallback.
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system.h"
#include "io/io_engine.h"
#include "io/testing/engine_test_util.h"
#include "io/testing/page_residency.h"

namespace dcp {
namespace {

using ::dcp::testing::Pattern;
using ::dcp::testing::ReadWhole;
using ::dcp::testing::TestPath;
using ::testing::HasSubstr;

// io_uring only: one ring per submitting thread, reused after threads exit,
// and requests inside registered buffers use fixed-buffer operations.
TEST(UringEngineTest, OneRingPerSubmittingThreadReusedAfterThreadsExit) {
  IoEngineOptions options;
  options.queue_depth = 4;
  absl::StatusOr<std::unique_ptr<IoEngine>> made = NewUringIoEngine(options);
  if (!made.ok())
    GTEST_SKIP() << "the kernel refuses io_uring: " << made.status();
  IoEngine& engine = **made;
  static constexpr int kThreads = 4;
  constexpr size_t kBlock = 4096, kBlocks = 16;
  std::vector<std::byte> data = Pattern(kBlock * kBlocks * kThreads, 11);
  const std::string path = TestPath("rings");
  std::unique_ptr<File> file = *LocalFileSystem().OpenForWrite(path);
  auto write_from_threads = [&](int round) {
    absl::Mutex mu;
    int submitted = 0;
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<IoRequest> batch;
        for (size_t b = 0; b < kBlocks; ++b) {
          const size_t off = (t * kBlocks + b) * kBlock;
          batch.push_back(
              IoRequest::Write(file.get(), off, data.data() + off, kBlock));
        }
        if (!SubmitAndWait(engine, batch).ok()) ++failures;
        // Stay alive until every thread has submitted: all are bound at once.
        absl::MutexLock lock(&mu);
        ++submitted;
        mu.Await(absl::Condition(
            +[](int* n) { return *n == kThreads; }, &submitted));
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0) << "round " << round;
  };
  write_from_threads(0);
  EXPECT_EQ(internal_io::UringStatsForTest(engine)->rings, kThreads);
  write_from_threads(1);  // New threads take the rings the old ones left.
  EXPECT_EQ(internal_io::UringStatsForTest(engine)->rings, kThreads);
  EXPECT_EQ(internal_io::UringStatsForTest(engine)->fixed_ios, 0);
  ASSERT_TRUE(file->Close().ok());
  EXPECT_EQ(ReadWhole(path), data);

  // Reads into a registered buffer use fixed-buffer reads, on a new
  // thread's ring too.
  auto* buffer =
      static_cast<std::byte*>(std::aligned_alloc(kBlock, data.size()));
  iovec region{buffer, data.size()};
  ASSERT_TRUE(engine.RegisterBuffers({&region, 1}).ok());
  std::unique_ptr<File> reader = *LocalFileSystem().OpenForRead(path);
  std::thread([&] {
    ASSERT_TRUE(SubmitAndWait(engine, {IoRequest::Read(reader.get(), 0, buffer,
                                                       data.size())})
                    .ok());
  }).join();
  EXPECT_EQ(std::memcmp(buffer, data.data(), data.size()), 0);
  EXPECT_GT(internal_io::UringStatsForTest(engine)->fixed_ios, 0);
  ASSERT_TRUE(engine.RegisterBuffers({}).ok());
  made->reset();
  std::free(buffer);
}

TEST(UringEngineTest, RingsAreCappedAndSharedBeyondMaxRings) {
  IoEngineOptions options;
  options.max_rings = 2;
  absl::StatusOr<std::unique_ptr<IoEngine>> made = NewUringIoEngine(options);
  if (!made.ok())
    GTEST_SKIP() << "the kernel refuses io_uring: " << made.status();
  const std::string path = TestPath("capped");
  std::unique_ptr<File> file = *LocalFileSystem().OpenForWrite(path);
  std::vector<std::byte> data = Pattern(8 * 65536, 4);
  absl::Mutex mu;
  int submitted = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      const size_t off = t * 65536;
      EXPECT_TRUE(
          SubmitAndWait(**made, {IoRequest::Write(file.get(), off,
                                                  data.data() + off, 65536)})
              .ok());
      absl::MutexLock lock(&mu);
      ++submitted;
      mu.Await(absl::Condition(
          +[](int* n) { return *n == 8; }, &submitted));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(internal_io::UringStatsForTest(**made)->rings, 2);
  ASSERT_TRUE(file->Close().ok());
  EXPECT_EQ(ReadWhole(path), data);
  EXPECT_EQ(
      internal_io::UringStatsForTest(*NewPosixIoEngine({})).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// Engines created and destroyed on threads that never synchronize with each
// other: the kernel maps new rings where old ones were, and every byte still
// lands. Under --config=tsan this is the regression test for ring memory
// reused across unrelated threads (reported as a race before ring mapping
// was ordered).
TEST(UringEngineTest, EnginesMadeAndDestroyedOnUnrelatedThreadsWriteAll) {
  if (!NewUringIoEngine({}).ok()) GTEST_SKIP() << "the kernel refuses io_uring";
  static constexpr int kThreads = 2, kRounds = 20;
  constexpr size_t kBlock = 4096;
  std::vector<std::string> paths;
  for (int t = 0; t < kThreads; ++t)
    paths.push_back(TestPath(absl::StrCat("unrelated_", t)));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<File> file = *LocalFileSystem().OpenForWrite(paths[t]);
      for (int round = 0; round < kRounds; ++round) {
        std::vector<std::byte> data = Pattern(kBlock, t * kRounds + round);
        absl::StatusOr<std::unique_ptr<IoEngine>> engine = NewUringIoEngine({});
        ASSERT_TRUE(engine.ok()) << engine.status();
        ASSERT_TRUE(SubmitAndWait(**engine,
                                  {IoRequest::Write(file.get(), round * kBlock,
                                                    data.data(), kBlock)})
                        .ok());
      }
      ASSERT_TRUE(file->Close().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    std::vector<std::byte> expected;
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::byte> data = Pattern(kBlock, t * kRounds + round);
      expected.insert(expected.end(), data.begin(), data.end());
    }
    EXPECT_EQ(ReadWhole(paths[t]), expected) << paths[t];
  }
}

// A File over a real one that reports its writes: how many run at once,
// the most at once, and their offsets in the order they started. `direct`
// is what direct() reports: the POSIX engine serializes buffered writes per
// file only. The first write to the file holds until a second write runs
// beside it on a file sharing `shared` (this one, or another), so that
// writes an engine runs in parallel are seen to overlap whatever the
// machine's load; the hold ends after kOverlapBound without one (a
// serializing engine), which only bounds the wait.
class ProbedFile final : public File {
 public:
  ProbedFile(std::unique_ptr<File> base, bool direct, std::atomic<int>* shared)
      : base_(std::move(base)), direct_(direct), shared_(shared) {}

  const std::string& path() const override { return base_->path(); }
  absl::Status PWrite(int64_t offset,
                      absl::Span<const std::byte> data) override {
    const int mine = ++running_;
    const int all = ++*shared_;
    {
      absl::MutexLock lock(&mu_);
      max_running_ = std::max(max_running_, mine);
      max_shared_ = std::max(max_shared_, all);
      starts_.push_back(offset);
    }
    if (!held_.exchange(true)) {
      const absl::Time until = absl::Now() + kOverlapBound;
      while (shared_->load() < 2 && absl::Now() < until) {
        std::this_thread::yield();
      }
    }
    absl::Status status = base_->PWrite(offset, data);
    --*shared_;
    --running_;
    return status;
  }
  absl::StatusOr<size_t> PRead(int64_t offset,
                               absl::Span<std::byte> buffer) override {
    {
      absl::MutexLock lock(&mu_);
      read_lengths_.push_back(buffer.size());
    }
    return base_->PRead(offset, buffer);
  }
  absl::Status Sync() override { return base_->Sync(); }
  absl::StatusOr<int64_t> Size() override { return base_->Size(); }
  absl::Status Truncate(int64_t size) override { return base_->Truncate(size); }
  absl::Status Close() override { return base_->Close(); }
  bool direct() const override { return direct_; }

  int max_running() {
    absl::MutexLock lock(&mu_);
    return max_running_;
  }
  // The most writes running at once on every file sharing `shared`, seen by
  // this file's writes.
  int max_shared() {
    absl::MutexLock lock(&mu_);
    return max_shared_;
  }
  std::vector<int64_t> starts() {
    absl::MutexLock lock(&mu_);
    return starts_;
  }
  // The length of every PRead, in call order.
  std::vector<size_t> read_lengths() {
    absl::MutexLock lock(&mu_);
    return read_lengths_;
  }

 private:
  std::unique_ptr<File> base_;
  const bool direct_;
  static constexpr absl::Duration kOverlapBound = absl::Seconds(10);
  std::atomic<int>* shared_;
  std::atomic<int> running_{0};
  std::atomic<bool> held_{false};  // The first write has held.
  absl::Mutex mu_;
  int max_running_ = 0;
  int max_shared_ = 0;
  std::vector<int64_t> starts_;
  std::vector<size_t> read_lengths_;
};

// Left at 0, max_buffered_read means max_transfer on both engines (a file
// without a native descriptor shows the parts to its PRead).
TEST(EngineDefaultsTest, BufferedReadsGoOutInMaxTransferParts) {
  ASSERT_EQ(IoEngineOptions{}.max_buffered_read, 0u);
  const std::string path = TestPath("default_parts");
  std::vector<std::byte> data = Pattern((20 << 20) + 4096, 7);
  {
    std::unique_ptr<File> file = *LocalFileSystem().OpenForWrite(path);
    ASSERT_TRUE(file->PWrite(0, data).ok());
    ASSERT_TRUE(file->Close().ok());
  }
  for (const char* which : {"posix", "uring"}) {
    const bool posix = std::string(which) == "posix";
    absl::StatusOr<std::unique_ptr<IoEngine>> engine =
        posix ? NewPosixIoEngine({}) : NewUringIoEngine({});
    if (!engine.ok()) continue;  // The kernel refuses io_uring here.
    std::atomic<int> running{0};
    ProbedFile reader(*LocalFileSystem().OpenForRead(path), /*direct=*/false,
                      &running);
    std::vector<std::byte> back(data.size());
    std::vector<size_t> transferred;
    ASSERT_TRUE(
        SubmitAndWait(**engine,
                      {IoRequest::Read(&reader, 0, back.data(), back.size())},
                      &transferred)
            .ok())
        << which;
    EXPECT_EQ(transferred, std::vector<size_t>{data.size()}) << which;
    EXPECT_EQ(back, data) << which;
    const size_t part = IoEngineOptions{}.max_transfer;
    std::vector<size_t> lengths = reader.read_lengths();
    std::sort(lengths.begin(), lengths.end());
    std::vector<size_t> expected(data.size() / part, part);
    expected.insert(expected.begin(), data.size() % part);
    EXPECT_EQ(lengths, expected) << which;
    ASSERT_TRUE(reader.Close().ok());
  }
}

// io_uring: at most max_buffered_reads_in_flight buffered reads are in
// flight on a ring, whatever its depth; O_DIRECT reads may fill the depth.
// Every byte arrives either way.
TEST(UringEngineTest, CapsBufferedReadsInFlightPerRing) {
  constexpr size_t kPart = 64 << 10;
  constexpr int kParts = 256;
  const std::string path = TestPath("capped_reads");
  std::vector<std::byte> data = Pattern(kPart * kParts, 11);
  {
    std::unique_ptr<File> file = *LocalFileSystem().OpenForWrite(path);
    ASSERT_TRUE(file->PWrite(0, data).ok());
    ASSERT_TRUE(file->Sync().ok());
    ASSERT_TRUE(file->Close().ok());
  }
  for (bool direct : {false, true}) {
    IoEngineOptions options;
    options.queue_depth = 32;
    options.max_buffered_reads_in_flight = 3;
    options.max_transfer = kPart;
    absl::StatusOr<std::unique_ptr<IoEngine>> engine =
        NewUringIoEngine(options);
    if (!engine.ok()) GTEST_SKIP() << "the kernel refuses io_uring here";
    OpenOptions open;
    open.direct = direct;
    absl::StatusOr<std::unique_ptr<File>> reader =
        LocalFileSystem().OpenForRead(path, open);
    ASSERT_TRUE(reader.ok()) << reader.status();
    if (direct && !(*reader)->direct()) continue;  // No O_DIRECT here.
    std::unique_ptr<std::byte, decltype(&std::free)> back(
        static_cast<std::byte*>(std::aligned_alloc(4096, data.size())),
        &std::free);
    ASSERT_TRUE(
        SubmitAndWait(**engine, {IoRequest::Read(reader->get(), 0, back.get(),
                                                 data.size())})
            .ok());
    EXPECT_EQ(std::memcmp(back.get(), data.data(), data.size()), 0);
    absl::StatusOr<internal_io::UringStats> stats =
        internal_io::UringStatsForTest(**engine);
    ASSERT_TRUE(stats.ok());
    if (direct) {
      EXPECT_EQ(stats->most_buffered_reads_in_flight, 0);
    } else {
      EXPECT_EQ(stats->most_buffered_reads_in_flight, 3);
    }
    ASSERT_TRUE((*reader)->Close().ok());
  }
}

// POSIX only: buffered writes to one file run one at a time in submission
// order (parallel buffered writes contend on the inode lock); other files,
// and O_DIRECT writes to one file, still run in parallel.
TEST(PosixEngineTest, BufferedWritesToOneFileRunOneAtATimeInOrder) {
  IoEngineOptions options;
  options.threads = 8;
  options.max_transfer = 4096;
  std::unique_ptr<IoEngine> engine = NewPosixIoEngine(options);
  constexpr size_t kParts = 24;
  std::atomic<int> buffered_running{0}, direct_running{0};
  std::vector<std::unique_ptr<ProbedFile>> files;
  std::vector<std::string> paths;
  std::vector<std::vector<std::byte>> data;
  std::vector<IoRequest> batch;
  for (bool direct : {false, false, true}) {
    paths.push_back(TestPath(direct ? "probed_direct" : "probed_buffered"));
    files.push_back(std::make_unique<ProbedFile>(
        *LocalFileSystem().OpenForWrite(paths.back()), direct,
        direct ? &direct_running : &buffered_running));
    data.push_back(Pattern(kParts * 4096, static_cast<uint32_t>(files.size())));
  }
  // Two requests per file, so order holds across requests too.
  for (size_t f = 0; f < files.size(); ++f) {
    const size_t half = kParts / 2 * 4096;
    batch.push_back(IoRequest::Write(files[f].get(), 0, data[f].data(), half));
    batch.push_back(
        IoRequest::Write(files[f].get(), half, data[f].data() + half, half));
  }
  ASSERT_TRUE(SubmitAndWait(*engine, batch).ok());
  std::vector<int64_t> in_order;
  for (size_t i = 0; i < kParts; ++i) in_order.push_back(i * 4096);
  for (int f : {0, 1}) {
    EXPECT_EQ(files[f]->max_running(), 1) << paths[f];
    EXPECT_EQ(files[f]->starts(), in_order) << paths[f];
  }
  // The two buffered files were written at the same time.
  EXPECT_GE(std::max(files[0]->max_shared(), files[1]->max_shared()), 2);
  EXPECT_GE(files[2]->max_running(), 2) << "O_DIRECT writes run in parallel";
  for (size_t f = 0; f < files.size(); ++f) {
    ASSERT_TRUE(files[f]->Close().ok());
    EXPECT_EQ(ReadWhole(paths[f]), data[f]) << paths[f];
  }
}

// Both engines: an uncached file's writes leave in the page cache no page
// they brought in where the kernel takes RWF_DONTCACHE, and its reads none
// where the file system drops clean pages (not tmpfs); elsewhere the
// refused flag is dropped and the bytes move as usual. Files on tmpfs (a
// memfd) are never uncached.
TEST(UncachedIoTest, LeavesThePageCacheOrFallsBackToCachedIo) {
  const bool dir_takes =
      testing::KernelTakesUncachedWrites(std::getenv("TEST_TMPDIR"));
  const bool dir_drops = testing::DropsCleanPages(std::getenv("TEST_TMPDIR"));
  std::vector<std::byte> data = Pattern(8 << 20, 9);
  // Mostly dropped where uncached I/O works, else mostly cached.
  auto expect_cached = [&](const std::string& path, bool dropped,
                           const std::string& what) {
    const testing::Residency r = dropped ? testing::AwaitMostlyDropped(path)
                                         : testing::PageResidency(path);
    ASSERT_EQ(r.pages, 2048) << what;
    if (dropped) {
      EXPECT_LT(r.resident * 2, r.pages) << what;
    } else {
      EXPECT_GT(r.resident * 2, r.pages) << what;
    }
  };
  for (const char* which : {"posix", "uring"}) {
    absl::StatusOr<std::unique_ptr<IoEngine>> engine =
        std::string(which) == "posix" ? NewPosixIoEngine({})
                                      : NewUringIoEngine({});
    if (!engine.ok()) continue;  // The kernel refuses io_uring here.
    for (bool uncached : {true, false}) {
      const std::string path = TestPath(uncached ? "uncached" : "cached");
      const std::string what = absl::StrCat(which, " ", path);
      OpenOptions options;
      options.uncached = uncached;
      std::unique_ptr<File> file =
          *LocalFileSystem().OpenForWrite(path, options);
      ASSERT_TRUE(
          SubmitAndWait(**engine, {IoRequest::Write(file.get(), 0, data.data(),
                                                    data.size()),
                                   IoRequest::Fsync(file.get())})
              .ok());
      EXPECT_EQ(file->uncached(), uncached && dir_takes) << what;
      ASSERT_TRUE(file->Close().ok());
      expect_cached(path, uncached && dir_takes, "write " + what);

      testing::DropCachedPages(path);
      std::unique_ptr<File> reader =
          *LocalFileSystem().OpenForRead(path, options);
      std::vector<std::byte> back(data.size());
      std::vector<size_t> got;
      ASSERT_TRUE(SubmitAndWait(**engine,
                                {IoRequest::Read(reader.get(), 0, back.data(),
                                                 back.size())},
                                &got)
                      .ok());
      EXPECT_EQ(got, std::vector<size_t>{data.size()}) << what;
      EXPECT_EQ(back, data) << what;
      expect_cached(path, uncached && dir_drops, "read " + what);
    }
    // A memfd (tmpfs) is never uncached, asked or not: its pages are the
    // file. Its bytes move as usual.
    std::unique_ptr<File> written = NewPosixFile(
        ::memfd_create("uncached_write", MFD_CLOEXEC), "memfd", true);
    ASSERT_TRUE(
        SubmitAndWait(**engine, {IoRequest::Write(written.get(), 0, data.data(),
                                                  data.size())})
            .ok())
        << which;
    EXPECT_FALSE(written->uncached()) << which;
    const int fd = ::memfd_create("uncached_read", MFD_CLOEXEC);
    ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0),
              static_cast<ssize_t>(data.size()));
    std::unique_ptr<File> read = NewPosixFile(fd, "memfd", true);
    std::vector<std::byte> back(data.size());
    ASSERT_TRUE(SubmitAndWait(
                    **engine,
                    {IoRequest::Read(read.get(), 0, back.data(), back.size())})
                    .ok())
        << which;
    EXPECT_FALSE(read->uncached()) << which;
    EXPECT_EQ(back, data) << which;
    ASSERT_EQ(*written->PRead(0, absl::MakeSpan(back)), data.size());
    EXPECT_EQ(back, data) << which;
  }
}

TEST(IoModeTest, ParsesModes) {
  EXPECT_EQ(*ParseIoMode("auto"), IoMode::kAuto);
  EXPECT_EQ(*ParseIoMode("uring"), IoMode::kUring);
  EXPECT_EQ(*ParseIoMode("posix"), IoMode::kPosix);
  EXPECT_EQ(ParseIoMode("aio").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IoModeName(IoMode::kPosix), "posix");
}

TEST(IoModeTest, AutoFallsBackOnceWhenUringSetupFailsAndUringFailsLoudly) {
  internal_io::SetUringSetupFailureForTest(EPERM);
  IoEngineOptions options;
  options.mode = IoMode::kUring;
  absl::StatusOr<std::unique_ptr<IoEngine>> uring = NewIoEngine(options);
  EXPECT_EQ(uring.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(uring.status().message(), HasSubstr("io_uring"));

  ::testing::internal::CaptureStderr();
  options.mode = IoMode::kAuto;
  absl::StatusOr<std::unique_ptr<IoEngine>> first = NewIoEngine(options);
  absl::StatusOr<std::unique_ptr<IoEngine>> second = NewIoEngine(options);
  const std::string err = ::testing::internal::GetCapturedStderr();
  internal_io::SetUringSetupFailureForTest(0);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ((*first)->name(), "posix");
  EXPECT_EQ((*second)->name(), "posix");
  EXPECT_TRUE(internal_io::FallbackNoticePrinted());
  // Said once: the notice appears once in the process, at most once here.
  size_t count = 0;
  for (size_t pos = err.find("io_uring is unavailable");
       pos != std::string::npos;
       pos = err.find("io_uring is unavailable", pos + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 1u) << err;

  if (NewUringIoEngine(options).ok()) {
    absl::StatusOr<std::unique_ptr<IoEngine>> normal = NewIoEngine(options);
    ASSERT_TRUE(normal.ok());
    EXPECT_EQ((*normal)->name(), "io_uring");
  }
}

}  // namespace
}  // namespace dcp
