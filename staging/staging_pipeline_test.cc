#include "staging/staging_pipeline.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cuda/host_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

constexpr size_t kChunk = 64 * 1024;

// Device memory of the host runtime filled with a pattern; freed on scope
// exit.
class DeviceBlock {
 public:
  DeviceBlock(DeviceRuntime& runtime, size_t bytes, unsigned seed)
      : runtime_(runtime), expected_(bytes) {
    for (size_t i = 0; i < bytes; ++i) {
      expected_[i] = static_cast<unsigned char>((i * 131 + seed * 7) >> 3);
    }
    data_ = *runtime.AllocateDevice(0, bytes);
    EXPECT_TRUE(
        runtime.Copy(data_, expected_.data(), bytes, CopyKind::kHostToDevice)
            .ok());
  }
  ~DeviceBlock() { runtime_.FreeDevice(data_).IgnoreError(); }

  TensorView view() const {
    return TensorView(data_, DType::kU8,
                      {static_cast<int64_t>(expected_.size())},
                      Device::Cuda(0));
  }
  const std::vector<unsigned char>& expected() const { return expected_; }

 private:
  DeviceRuntime& runtime_;
  void* data_ = nullptr;
  std::vector<unsigned char> expected_;
};

// Reassembles pieces per destination.
class Assembler {
 public:
  absl::Status Add(const StagedPiece& piece) {
    std::vector<unsigned char>& out = outputs_[piece.destination];
    if (out.size() != piece.offset) {
      return absl::InternalError("piece out of order");
    }
    const auto* b =
        reinterpret_cast<const unsigned char*>(piece.bytes().data());
    out.insert(out.end(), b, b + piece.length);
    order_.push_back({piece.item, piece.offset});
    return absl::OkStatus();
  }
  const std::vector<unsigned char>& output(uint64_t d) { return outputs_[d]; }
  const std::vector<std::pair<size_t, size_t>>& order() const { return order_; }

 private:
  std::map<uint64_t, std::vector<unsigned char>> outputs_;
  std::vector<std::pair<size_t, size_t>> order_;
};

std::unique_ptr<HostBufferPool> MakePool(DeviceRuntime& runtime, int chunks) {
  HostBufferPoolOptions o;
  o.chunk_bytes = kChunk;
  o.total_bytes = kChunk * chunks;
  auto pool = HostBufferPool::Create(&runtime, o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

TEST(StagingPipelineTest, StateLargerThanPoolRoundTripsWithinTheBound) {
  auto runtime = CreateHostRuntime();
  auto pool = MakePool(*runtime, 4);  // 256 KiB.
  // 2.2 MiB of device tensors: ~9x the pool. Sizes hit chunk boundaries,
  // odd tails and an empty tensor.
  std::vector<std::unique_ptr<DeviceBlock>> blocks;
  for (size_t size : {kChunk * 10, kChunk + 1, size_t{0}, size_t{17},
                      kChunk * 3 - 5, size_t{1} << 20}) {
    blocks.push_back(
        std::make_unique<DeviceBlock>(*runtime, size, blocks.size()));
  }
  std::vector<unsigned char> host_src(100000);
  for (size_t i = 0; i < host_src.size(); ++i) host_src[i] = i % 251;

  std::vector<PipelineItem> items;
  for (size_t i = 0; i < blocks.size(); ++i) {
    items.push_back({blocks[i]->view(), 100 + i});
  }
  items.push_back({TensorView(host_src.data(), DType::kU8,
                              {static_cast<int64_t>(host_src.size())}),
                   999});

  StagingPipeline pipeline(runtime.get(), pool.get(), {.num_streams = 3});
  Assembler assembler;
  ASSERT_TRUE(pipeline
                  .Run(items,
                       [&](StagedPiece piece) {
                         EXPECT_LE(pool->in_use(), pool->num_chunks());
                         return assembler.Add(piece);
                       })
                  .ok());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(assembler.output(100 + i), blocks[i]->expected()) << i;
  }
  EXPECT_EQ(assembler.output(999), host_src);
  EXPECT_LE(pool->peak_in_use(), pool->num_chunks());
  EXPECT_EQ(pool->in_use(), 0);
  // Pieces arrive in item order, offsets ascending.
  for (size_t k = 1; k < assembler.order().size(); ++k) {
    EXPECT_LT(assembler.order()[k - 1], assembler.order()[k]);
  }
  size_t total = host_src.size();
  for (const auto& b : blocks) total += b->expected().size();
  EXPECT_EQ(pipeline.last_stats().bytes, total);
  // A second save reuses the same pool and streams.
  Assembler again;
  ASSERT_TRUE(
      pipeline.Run(items, [&](StagedPiece p) { return again.Add(p); }).ok());
  EXPECT_EQ(again.output(100), blocks[0]->expected());
}

// A trace of what happened, in one global order.
class Trace {
 public:
  void Add(std::string what) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(what));
  }
  // Position of `what` in the trace, or -1.
  int IndexOf(const std::string& what) {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < events_.size(); ++i) {
      if (events_[i] == what) return static_cast<int>(i);
    }
    return -1;
  }
  bool AwaitEvent(const std::string& what, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::find(events_.begin(), events_.end(), what) != events_.end();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

TEST(StagingPipelineTest, CopyOfNextPieceOverlapsConsumerOfThisOne) {
  Trace trace;
  std::atomic<int> copies{0};
  HostRuntimeOptions options;
  options.copy_observer = [&](const HostCopyTrace& t) {
    if (t.kind != CopyKind::kDeviceToHost) return;
    if (t.phase == HostCopyTrace::Phase::kStart) {
      trace.Add("copy_start " + std::to_string(copies.fetch_add(1)));
    }
  };
  auto runtime = CreateHostRuntime(options);
  auto pool = MakePool(*runtime, 2);
  DeviceBlock block(*runtime, kChunk * 6, 1);
  std::vector<PipelineItem> items = {{block.view(), 0}};
  StagingPipeline pipeline(runtime.get(), pool.get(), {.num_streams = 1});
  int k = 0;
  Assembler assembler;
  ASSERT_TRUE(pipeline
                  .Run(items,
                       [&](StagedPiece piece) {
                         const std::string n = std::to_string(k);
                         trace.Add("consume_begin " + n);
                         // The copy of piece k+1 must start while piece k is
                         // still held here. A serial stager would never start
                         // it: the wait then fails (the timeout only bounds a
                         // failing run).
                         if (k + 1 < 6) {
                           EXPECT_TRUE(trace.AwaitEvent(
                               "copy_start " + std::to_string(k + 1),
                               absl::Seconds(20)))
                               << "copy of piece " << k + 1
                               << " did not start while piece " << k
                               << " was being consumed";
                         }
                         absl::Status s = assembler.Add(piece);
                         trace.Add("consume_end " + n);
                         ++k;
                         return s;
                       })
                  .ok());
  EXPECT_EQ(assembler.output(0), block.expected());
  for (int i = 0; i + 1 < 6; ++i) {
    const int next_copy = trace.IndexOf("copy_start " + std::to_string(i + 1));
    const int this_end = trace.IndexOf("consume_end " + std::to_string(i));
    ASSERT_GE(next_copy, 0);
    ASSERT_GE(this_end, 0);
    EXPECT_LT(next_copy, this_end) << i;
    // And a piece is consumed only after its own copy started.
    EXPECT_LT(trace.IndexOf("copy_start " + std::to_string(i)),
              trace.IndexOf("consume_begin " + std::to_string(i)));
  }
  EXPECT_LE(pool->peak_in_use(), 2);
}

TEST(StagingPipelineTest, AsyncConsumerKeepsLeasesAndMemoryStaysBounded) {
  auto runtime = CreateHostRuntime();
  auto pool = MakePool(*runtime, 3);
  DeviceBlock block(*runtime, kChunk * 20 + 3, 2);
  std::vector<PipelineItem> items = {{block.view(), 7}};
  // A "writer" thread that finishes pieces later, like io_uring completions.
  absl::Mutex mu;
  std::deque<StagedPiece> pending;
  bool done = false;
  std::vector<unsigned char> out(block.expected().size());
  std::thread writer([&] {
    while (true) {
      StagedPiece piece;
      {
        absl::MutexLock lock(&mu);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
          return !pending.empty() || done;
        };
        mu.Await(absl::Condition(&ready));
        if (pending.empty()) return;
        piece = std::move(pending.front());
        pending.pop_front();
      }
      std::memcpy(out.data() + piece.offset, piece.bytes().data(),
                  piece.length);
      // The lease dies here: the chunk goes back to the pool.
    }
  });
  StagingPipeline pipeline(runtime.get(), pool.get());
  absl::Status s = pipeline.Run(items, [&](StagedPiece piece) {
    absl::MutexLock lock(&mu);
    pending.push_back(std::move(piece));
    return absl::OkStatus();
  });
  {
    absl::MutexLock lock(&mu);
    done = true;
  }
  writer.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(out, block.expected());
  EXPECT_LE(pool->peak_in_use(), 3);
  EXPECT_EQ(pool->in_use(), 0);
}

TEST(StagingPipelineTest, CopyFaultStopsAndNamesTheItem) {
  std::atomic<int> copies{0};
  HostRuntimeOptions options;
  options.copy_fault = [&](const HostCopyTrace& t) {
    if (t.kind == CopyKind::kDeviceToHost && copies.fetch_add(1) == 2) {
      return absl::InternalError("injected device fault");
    }
    return absl::OkStatus();
  };
  auto runtime = CreateHostRuntime(options);
  auto pool = MakePool(*runtime, 2);
  DeviceBlock block(*runtime, kChunk * 8, 3);
  std::vector<PipelineItem> items = {{block.view(), 42}};
  StagingPipeline pipeline(runtime.get(), pool.get(), {.num_streams = 1});
  int consumed = 0;
  absl::Status s = pipeline.Run(items, [&](StagedPiece) {
    ++consumed;
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("injected device fault"));
  EXPECT_THAT(s.message(), HasSubstr("destination 42"));
  EXPECT_THAT(s.message(), HasSubstr("offset 131072"));
  EXPECT_EQ(consumed, 2);
  EXPECT_EQ(pool->in_use(), 0);
}

TEST(StagingPipelineTest, ConsumerErrorStopsEarly) {
  auto runtime = CreateHostRuntime();
  auto pool = MakePool(*runtime, 2);
  DeviceBlock block(*runtime, kChunk * 50, 4);
  std::vector<PipelineItem> items = {{block.view(), 1}};
  StagingPipeline pipeline(runtime.get(), pool.get());
  int consumed = 0;
  absl::Status s = pipeline.Run(items, [&](StagedPiece) {
    return ++consumed == 3 ? absl::ResourceExhaustedError("disk full")
                           : absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(consumed, 3);
  EXPECT_EQ(pool->in_use(), 0);
  EXPECT_LE(pipeline.last_stats().pieces, 3u);
}

TEST(StagingPipelineTest, RejectsNonContiguousAndUnknownDevice) {
  auto runtime = CreateHostRuntime();
  auto pool = MakePool(*runtime, 2);
  std::vector<float> host(16);
  StagingPipeline pipeline(runtime.get(), pool.get());
  auto never = [](StagedPiece) {
    ADD_FAILURE() << "consumer called";
    return absl::OkStatus();
  };
  std::vector<PipelineItem> strided = {
      {TensorView(host.data(), DType::kF32, {4, 2}, {4, 2}, Device::Cpu()), 5}};
  absl::Status s = pipeline.Run(strided, never);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not contiguous"));
  std::vector<PipelineItem> bad_device = {
      {TensorView(host.data(), DType::kF32, {16}, Device::Cuda(3)), 6}};
  s = pipeline.Run(bad_device, never);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cuda:3"));
}

}  // namespace
}  // namespace dcp
