// The IoEngine conformance suite: every implementation runs the same tests.
#include "io/io_engine.h"

#include <signal.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

struct EngineCase {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<IoEngine>>(IoEngineOptions)>
      make;
  // Open files through a FaultInjectionFileSystem with no faults armed: its
  // files have no descriptor, so engines go through File methods.
  bool through_fault_wrapper = false;
};

std::string TestPath(const std::string& name) {
  static int counter = 0;
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, "_", counter++);
}

std::vector<std::byte> Pattern(size_t size, uint32_t seed) {
  std::vector<std::byte> out(size);
  uint32_t state = seed * 2654435761u + 7;
  for (std::byte& b : out) {
    state = state * 1664525u + 1013904223u;
    b = static_cast<std::byte>(state >> 24);
  }
  return out;
}

std::vector<std::byte> ReadWhole(const std::string& path) {
  std::unique_ptr<File> file = *LocalFileSystem().OpenForRead(path);
  std::vector<std::byte> out(*file->Size());
  EXPECT_EQ(*file->PRead(0, absl::MakeSpan(out)), out.size());
  return out;
}

class IoEngineConformanceTest : public ::testing::TestWithParam<EngineCase> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<IoEngine>> probe = GetParam().make({});
    if (!probe.ok() && GetParam().name.rfind("uring", 0) == 0) {
      GTEST_SKIP() << "the kernel refuses io_uring here: " << probe.status();
    }
  }

  FileSystemBase& fs() {
    if (GetParam().through_fault_wrapper) return faulty_;
    return LocalFileSystem();
  }

  std::unique_ptr<IoEngine> Make(IoEngineOptions options = {}) {
    absl::StatusOr<std::unique_ptr<IoEngine>> engine = GetParam().make(options);
    if (!engine.ok()) {
      ADD_FAILURE() << engine.status();
      return nullptr;
    }
    return *std::move(engine);
  }

 private:
  FaultInjectionFileSystem faulty_{LocalFileSystem()};
};

TEST_P(IoEngineConformanceTest, WritesSplitReadsAndFsyncsAcrossFiles) {
  IoEngineOptions options;
  options.max_transfer = 4096;  // Many parts per request.
  options.queue_depth = 8;
  std::unique_ptr<IoEngine> engine = Make(options);
  ASSERT_NE(engine, nullptr);
  constexpr int kFiles = 3;
  std::vector<std::unique_ptr<File>> files;
  std::vector<std::string> paths;
  std::vector<std::vector<std::byte>> data;
  std::vector<IoRequest> batch;
  for (int f = 0; f < kFiles; ++f) {
    paths.push_back(TestPath("engine"));
    files.push_back(*fs().OpenForWrite(paths.back()));
    data.push_back(Pattern(100000 + f * 777, f));
    // Two halves, second first: completion order does not matter.
    const size_t half = data[f].size() / 2;
    batch.push_back(IoRequest::Write(
        files[f].get(), half, data[f].data() + half, data[f].size() - half));
    batch.push_back(IoRequest::Write(files[f].get(), 0, data[f].data(), half));
    batch.push_back(IoRequest::Fsync(files[f].get()));
  }
  std::vector<size_t> transferred;
  ASSERT_TRUE(SubmitAndWait(*engine, batch, &transferred).ok());
  for (int f = 0; f < kFiles; ++f) {
    EXPECT_EQ(transferred[3 * f] + transferred[3 * f + 1], data[f].size());
    EXPECT_EQ(transferred[3 * f + 2], 0u);
    ASSERT_TRUE(files[f]->Close().ok());
    EXPECT_EQ(ReadWhole(paths[f]), data[f]) << f;
  }

  // Read back through the engine, including past the end of file.
  std::vector<std::unique_ptr<File>> readers;
  std::vector<std::vector<std::byte>> back;
  batch.clear();
  for (int f = 0; f < kFiles; ++f) {
    readers.push_back(*fs().OpenForRead(paths[f]));
    back.emplace_back(data[f].size() + 5000);
    batch.push_back(
        IoRequest::Read(readers[f].get(), 0, back[f].data(), back[f].size()));
  }
  ASSERT_TRUE(SubmitAndWait(*engine, batch, &transferred).ok());
  for (int f = 0; f < kFiles; ++f) {
    EXPECT_EQ(transferred[f], data[f].size()) << "short only at end of file";
    back[f].resize(data[f].size());
    EXPECT_EQ(back[f], data[f]);
  }
}

TEST_P(IoEngineConformanceTest, FsyncCompletesAfterEarlierWritesToItsFile) {
  IoEngineOptions options;
  options.max_transfer = 1 << 12;
  std::unique_ptr<IoEngine> engine = Make(options);
  ASSERT_NE(engine, nullptr);
  const std::string path = TestPath("fsync_order");
  std::unique_ptr<File> file = *fs().OpenForWrite(path);
  std::vector<std::byte> data = Pattern(1 << 20, 3);
  std::vector<IoRequest> batch;
  for (size_t off = 0; off < data.size(); off += 65536) {
    batch.push_back(
        IoRequest::Write(file.get(), off, data.data() + off, 65536));
  }
  batch.push_back(IoRequest::Fsync(file.get()));
  std::vector<Future<size_t>> futures = engine->Submit(batch);
  ASSERT_TRUE(futures.back().Wait().ok());
  for (size_t i = 0; i + 1 < futures.size(); ++i) {
    EXPECT_TRUE(futures[i].ready()) << "write " << i << " after the fsync";
  }
  ASSERT_TRUE(file->Close().ok());
  EXPECT_EQ(ReadWhole(path), data);
}

TEST_P(IoEngineConformanceTest, ReadAtOrBeyondEndOfFileTransfersWhatExists) {
  std::unique_ptr<IoEngine> engine = Make();
  ASSERT_NE(engine, nullptr);
  const std::string path = TestPath("eof");
  {
    std::unique_ptr<File> w = *fs().OpenForWrite(path);
    std::vector<std::byte> data = Pattern(1000, 1);
    ASSERT_TRUE(w->PWrite(0, data).ok());
  }
  std::unique_ptr<File> file = *fs().OpenForRead(path);
  std::vector<std::byte> buffer(4096);
  std::vector<size_t> transferred;
  ASSERT_TRUE(
      SubmitAndWait(*engine,
                    {IoRequest::Read(file.get(), 900, buffer.data(), 500),
                     IoRequest::Read(file.get(), 5000, buffer.data(), 10),
                     IoRequest::Read(file.get(), 0, buffer.data(), 0)},
                    &transferred)
          .ok());
  EXPECT_EQ(transferred, (std::vector<size_t>{100, 0, 0}));
}

TEST_P(IoEngineConformanceTest, ErrorsNameOperationPathAndOffset) {
  std::unique_ptr<IoEngine> engine = Make();
  ASSERT_NE(engine, nullptr);
  const std::string path = TestPath("badfd");
  { ASSERT_TRUE((*fs().OpenForWrite(path))->Close().ok()); }
  std::unique_ptr<File> read_only = *fs().OpenForRead(path);
  std::vector<std::byte> data(100);
  std::vector<Future<size_t>> futures = engine->Submit(
      {IoRequest::Write(read_only.get(), 4096, data.data(), 100)});
  const absl::StatusOr<size_t>& result = futures[0].Wait();
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(),
              testing::AllOf(HasSubstr("pwrite"), HasSubstr(path),
                             HasSubstr("offset=4096")));
}

TEST_P(IoEngineConformanceTest, ShortWriteIsResubmittedForTheRemainder) {
  // RLIMIT_FSIZE makes the kernel write only up to the limit (a short
  // write); the engine must retry the rest, which then fails with EFBIG at
  // exactly the limit.
  std::unique_ptr<IoEngine> engine = Make();
  ASSERT_NE(engine, nullptr);
  const std::string path = TestPath("short");
  std::unique_ptr<File> file = *fs().OpenForWrite(path);
  std::vector<std::byte> data = Pattern(20000, 9);
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 12288;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::vector<Future<size_t>> futures = engine->Submit(
      {IoRequest::Write(file.get(), 0, data.data(), data.size())});
  absl::StatusOr<size_t> result = futures[0].Wait();
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("offset=12288"));
  ASSERT_TRUE(file->Close().ok());
  std::vector<std::byte> written = ReadWhole(path);
  ASSERT_EQ(written.size(), 12288u);
  EXPECT_TRUE(std::equal(written.begin(), written.end(), data.begin()));
}

TEST_P(IoEngineConformanceTest,
       ManyRequestsFromManyThreadsWithRegisteredBuffer) {
  IoEngineOptions options;
  options.queue_depth = 8;
  std::unique_ptr<IoEngine> engine = Make(options);
  ASSERT_NE(engine, nullptr);
  constexpr size_t kBlock = 4096;
  constexpr int kThreads = 4, kBlocksPerThread = 64;
  auto* buffer = static_cast<std::byte*>(
      std::aligned_alloc(kBlock, kBlock * kThreads * kBlocksPerThread));
  std::vector<std::byte> data =
      Pattern(kBlock * kThreads * kBlocksPerThread, 5);
  std::memcpy(buffer, data.data(), data.size());
  iovec region{buffer, data.size()};
  ASSERT_TRUE(engine->RegisterBuffers({&region, 1}).ok());
  const std::string path = TestPath("threads");
  std::unique_ptr<File> file = *fs().OpenForWrite(path);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<IoRequest> batch;
      for (int b = 0; b < kBlocksPerThread; ++b) {
        const size_t off = (t * kBlocksPerThread + b) * kBlock;
        batch.push_back(
            IoRequest::Write(file.get(), off, buffer + off, kBlock));
      }
      if (!SubmitAndWait(*engine, batch).ok()) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(SubmitAndWait(*engine, {IoRequest::Fsync(file.get())}).ok());
  std::memset(buffer, 0, data.size());
  std::unique_ptr<File> reader = *fs().OpenForRead(path);
  ASSERT_TRUE(SubmitAndWait(*engine, {IoRequest::Read(reader.get(), 0, buffer,
                                                      data.size())})
                  .ok());
  EXPECT_EQ(std::memcmp(buffer, data.data(), data.size()), 0);
  ASSERT_TRUE(engine->RegisterBuffers({}).ok());
  engine.reset();
  std::free(buffer);
}

TEST_P(IoEngineConformanceTest, DestructionWaitsForRequestsInFlight) {
  std::unique_ptr<IoEngine> engine = Make();
  ASSERT_NE(engine, nullptr);
  const std::string path = TestPath("destroy");
  std::unique_ptr<File> file = *fs().OpenForWrite(path);
  std::vector<std::byte> data = Pattern(1 << 20, 2);
  std::vector<Future<size_t>> futures =
      engine->Submit({IoRequest::Write(file.get(), 0, data.data(), data.size()),
                      IoRequest::Fsync(file.get())});
  engine.reset();
  for (const Future<size_t>& f : futures) {
    ASSERT_TRUE(f.ready());
    EXPECT_TRUE(f.Wait().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Engines, IoEngineConformanceTest,
    ::testing::Values(
        EngineCase{
            "posix",
            [](IoEngineOptions o) -> absl::StatusOr<std::unique_ptr<IoEngine>> {
              return NewPosixIoEngine(o);
            }},
        EngineCase{"uring",
                   [](IoEngineOptions o) { return NewUringIoEngine(o); }}),
    [](const ::testing::TestParamInfo<EngineCase>& info) {
      return info.param.name;
    });

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
