// The IoEngine conformance suite: every implementation runs the same tests,
// on local files and on files of the fault-injecting wrapper (no descriptor:
// the engines go through File methods).
#include "io/io_engine.h"

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
#include "io/testing/page_residency.h"

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

// Sets RLIMIT_FSIZE for its lifetime: the kernel then writes files only up
// to `bytes` (a short write) and fails writes past it with EFBIG.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::signal(SIGXFSZ, SIG_IGN);
    EXPECT_EQ(::getrlimit(RLIMIT_FSIZE, &old_), 0);
    struct rlimit limit = old_;
    limit.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  }
  ~FileSizeLimit() { EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &old_), 0); }

 private:
  struct rlimit old_;
};

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
  // The wrapper's call counts and faults (through_fault_wrapper cases).
  FaultInjectionFileSystem& faulty() { return faulty_; }

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

TEST_P(IoEngineConformanceTest, BufferedReadsInTheirOwnPartSizeAreExact) {
  IoEngineOptions options;
  options.max_transfer = 4096;
  options.max_buffered_read = 12288 + 512;  // Parts not block multiples.
  std::unique_ptr<IoEngine> engine = Make(options);
  ASSERT_NE(engine, nullptr);
  const std::string path = TestPath("buffered_read");
  std::vector<std::byte> data = Pattern(50001, 4);
  {
    std::unique_ptr<File> file = *fs().OpenForWrite(path);
    ASSERT_TRUE(SubmitAndWait(
                    *engine,
                    {IoRequest::Write(file.get(), 0, data.data(), data.size())})
                    .ok());
    ASSERT_TRUE(file->Close().ok());
  }
  std::unique_ptr<File> reader = *fs().OpenForRead(path);
  ASSERT_FALSE(reader->direct());
  for (int64_t offset : {int64_t{0}, int64_t{777}}) {
    std::vector<std::byte> back(data.size() + 9000, std::byte{0x5a});
    std::vector<size_t> transferred;
    ASSERT_TRUE(SubmitAndWait(*engine,
                              {IoRequest::Read(reader.get(), offset,
                                               back.data(), back.size())},
                              &transferred)
                    .ok());
    ASSERT_EQ(transferred[0], data.size() - offset);
    EXPECT_TRUE(std::equal(data.begin() + offset, data.end(), back.begin()));
  }
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
              ::testing::AllOf(HasSubstr("pwrite"), HasSubstr(path),
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
  absl::StatusOr<size_t> result = [&] {
    FileSizeLimit limit(12288);
    return engine
        ->Submit({IoRequest::Write(file.get(), 0, data.data(), data.size())})
        .at(0)
        .Wait();
  }();
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("offset=12288"));
  ASSERT_TRUE(file->Close().ok());
  std::vector<std::byte> written = ReadWhole(path);
  ASSERT_EQ(written.size(), 12288u);
  EXPECT_TRUE(std::equal(written.begin(), written.end(), data.begin()));
}

TEST_P(IoEngineConformanceTest,
       FsyncOrWritebackAfterAFailedWriteIsAbortedNotIssued) {
  std::unique_ptr<IoEngine> engine = Make();
  ASSERT_NE(engine, nullptr);
  for (IoRequest::Op op : {IoRequest::Op::kFsync, IoRequest::Op::kWriteback}) {
    const bool fsync = op == IoRequest::Op::kFsync;
    const std::string path = TestPath("aborted");
    std::unique_ptr<File> file = *fs().OpenForWrite(path);
    std::vector<std::byte> data = Pattern(20000, 6);
    std::vector<Future<size_t>> futures;
    {
      FileSizeLimit limit(8192);  // The write past it fails with EFBIG.
      futures = engine->Submit(
          {IoRequest::Write(file.get(), 0, data.data(), data.size()),
           fsync ? IoRequest::Fsync(file.get())
                 : IoRequest::Writeback(file.get(), 0, data.size())});
      for (const Future<size_t>& f : futures) f.Wait();
    }
    ASSERT_FALSE(futures[0].Wait().ok());
    const absl::StatusOr<size_t>& after = futures[1].Wait();
    EXPECT_EQ(after.status().code(), absl::StatusCode::kAborted)
        << after.status();
    EXPECT_THAT(after.status().message(),
                ::testing::AllOf(HasSubstr(fsync ? "fsync" : "sync_file_range"),
                                 HasSubstr(path), HasSubstr("not issued")));
  }
  if (GetParam().through_fault_wrapper) {
    EXPECT_EQ(faulty().calls(FaultOp::kSync), 0);
    EXPECT_EQ(faulty().calls(FaultOp::kWriteback), 0);
  }
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

TEST_P(IoEngineConformanceTest,
       FsyncAndWritebackStartAfterEarlierWritesToTheirFile) {
  IoEngineOptions options;
  options.max_transfer = 1 << 12;
  std::unique_ptr<IoEngine> engine = Make(options);
  ASSERT_NE(engine, nullptr);
  const std::string path = TestPath("sync_order");
  std::unique_ptr<File> file = *fs().OpenForWrite(path);
  std::vector<std::byte> data = Pattern(1 << 20, 3);
  const size_t half = data.size() / 2;
  std::vector<IoRequest> batch;
  for (size_t off = 0; off < data.size(); off += 65536) {
    batch.push_back(
        IoRequest::Write(file.get(), off, data.data() + off, 65536));
    // After the first half: a writeback of it, which the writes after it
    // do not wait for.
    if (off + 65536 == half) {
      batch.push_back(IoRequest::Writeback(file.get(), 0, half));
    }
  }
  batch.push_back(IoRequest::Fsync(file.get()));
  std::vector<Future<size_t>> futures = engine->Submit(batch);
  const size_t writeback = half / 65536;
  ASSERT_EQ(batch[writeback].op, IoRequest::Op::kWriteback);
  const absl::StatusOr<size_t>& written_back = futures[writeback].Wait();
  ASSERT_TRUE(written_back.ok()) << written_back.status();
  EXPECT_EQ(*written_back, 0u);
  for (size_t i = 0; i < writeback; ++i) {
    EXPECT_TRUE(futures[i].ready()) << "write " << i << " after the writeback";
  }
  ASSERT_TRUE(futures.back().Wait().ok());
  for (size_t i = 0; i + 1 < futures.size(); ++i) {
    EXPECT_TRUE(futures[i].ready()) << "request " << i << " after the fsync";
    EXPECT_TRUE(futures[i].Wait().ok()) << i;
  }
  if (GetParam().through_fault_wrapper) {
    EXPECT_EQ(faulty().calls(FaultOp::kWriteback), 1);
  }
  ASSERT_TRUE(file->Close().ok());
  EXPECT_EQ(ReadWhole(path), data);
}

TEST_P(IoEngineConformanceTest, WritebackIsAHintWhereThereIsNothingToDo) {
  // An empty range, a range past the end of the file, one longer than an
  // io_uring length field holds (4 GiB and more), and a pipe (ESPIPE) all
  // complete OK without writing anything.
  std::unique_ptr<IoEngine> engine = Make();
  ASSERT_NE(engine, nullptr);
  const std::string path = TestPath("writeback_hint");
  std::unique_ptr<File> file = *fs().OpenForWrite(path);
  std::vector<std::byte> data = Pattern(10000, 5);
  ASSERT_TRUE(file->PWrite(0, data).ok());
  std::vector<IoRequest> batch = {
      IoRequest::Writeback(file.get(), 0, 0),
      IoRequest::Writeback(file.get(), int64_t{1} << 30, 4096),
      IoRequest::Writeback(file.get(), 0, (size_t{5} << 30) + 12345)};
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  std::unique_ptr<File> pipe = NewPosixFile(fds[1], "pipe");
  if (!GetParam().through_fault_wrapper) {
    batch.push_back(IoRequest::Writeback(pipe.get(), 0, 4096));
  }
  absl::Status status = SubmitAndWait(*engine, batch);
  EXPECT_TRUE(status.ok()) << status;
  if (GetParam().through_fault_wrapper) {
    // The empty range is not even issued.
    EXPECT_EQ(faulty().calls(FaultOp::kWriteback), 2);
  }
  ASSERT_TRUE(file->Close().ok());
  EXPECT_EQ(ReadWhole(path), data);
}

TEST_P(IoEngineConformanceTest, WritebackErrorsNameTheFileAndRange) {
  if (!GetParam().through_fault_wrapper) {
    GTEST_SKIP() << "the error is injected through the fault wrapper";
  }
  std::unique_ptr<IoEngine> engine = Make();
  ASSERT_NE(engine, nullptr);
  const std::string path = TestPath("writeback_eio");
  std::unique_ptr<File> file = *fs().OpenForWrite(path);
  faulty().Inject(Fault{FaultOp::kWriteback, EIO, "writeback_eio"});
  absl::Status status =
      SubmitAndWait(*engine, {IoRequest::Writeback(file.get(), 8192, 4096)});
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(
      status.message(),
      ::testing::AllOf(HasSubstr("sync_file_range"), HasSubstr(path),
                       HasSubstr("offset=8192"), HasSubstr("length=4096")));
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
                   [](IoEngineOptions o) { return NewUringIoEngine(o); }},
        EngineCase{
            "posix_through_fault_wrapper",
            [](IoEngineOptions o) -> absl::StatusOr<std::unique_ptr<IoEngine>> {
              return NewPosixIoEngine(o);
            },
            /*through_fault_wrapper=*/true},
        EngineCase{"uring_through_fault_wrapper",
                   [](IoEngineOptions o) { return NewUringIoEngine(o); },
                   /*through_fault_wrapper=*/true}),
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
