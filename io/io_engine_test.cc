// The IoEngine conformance suite: every implementation runs the same tests,
// on local files and on files of the fault-injecting wrapper (no descriptor:
// the engines go through File methods).
#include "io/io_engine.h"

#include <fcntl.h>
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
#include "io/testing/engine_test_util.h"
#include "io/testing/page_residency.h"

namespace dcp {
namespace {

using ::dcp::testing::Pattern;
using ::dcp::testing::ReadWhole;
using ::dcp::testing::TestPath;
using ::testing::HasSubstr;

struct EngineCase {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<IoEngine>>(IoEngineOptions)>
      make;
  // Open files through a FaultInjectionFileSystem with no faults armed: its
  // files have no descriptor, so engines go through File methods.
  bool through_fault_wrapper = false;
};

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

// tmpfs takes O_DIRECT since Linux 6.6, but there it saves no copy and
// io_uring reads such files on one kernel worker at a time: files whose
// pages are the file open buffered even when O_DIRECT is asked for, and
// read and write back exactly through both engines.
TEST(MemoryBackedFiles, OpenBufferedWhenDirectIsAsked) {
  if (!::dcp::testing::IsWritableTmpfs("/dev/shm")) {
    GTEST_SKIP() << "no writable tmpfs at /dev/shm";
  }
  const std::string path =
      absl::StrCat("/dev/shm/dcp-io-engine-test-", ::getpid());
  OpenOptions direct;
  direct.exclusive = false;
  direct.direct = true;
  std::vector<std::byte> data(3 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 31 + 7);
  for (IoMode mode : {IoMode::kPosix, IoMode::kUring}) {
    IoEngineOptions options;
    options.mode = mode;
    absl::StatusOr<std::unique_ptr<IoEngine>> engine = NewIoEngine(options);
    if (!engine.ok()) continue;  // No io_uring here.
    {
      absl::StatusOr<std::unique_ptr<File>> file =
          LocalFileSystem().OpenForWrite(path, direct);
      ASSERT_TRUE(file.ok()) << file.status();
      EXPECT_FALSE((*file)->direct());
      EXPECT_EQ(::fcntl((*file)->native_fd(), F_GETFL) & O_DIRECT, 0);
      // Neither the buffer nor the length is 4 KiB aligned.
      ASSERT_TRUE(SubmitAndWait(**engine, {IoRequest::Write(file->get(), 0,
                                                            data.data() + 1,
                                                            data.size() - 1)})
                      .ok());
      ASSERT_TRUE((*file)->Close().ok());
    }
    absl::StatusOr<std::unique_ptr<File>> reader =
        LocalFileSystem().OpenForRead(path, direct);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_FALSE((*reader)->direct());
    std::vector<std::byte> back(data.size() - 1);
    ASSERT_TRUE(
        SubmitAndWait(**engine, {IoRequest::Read(reader->get(), 0, back.data(),
                                                 back.size())})
            .ok());
    EXPECT_TRUE(std::equal(back.begin(), back.end(), data.begin() + 1));
  }
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace dcp
