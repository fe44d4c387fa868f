#include "staging/stager.h"

#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/status.h"
#include "cuda/host_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

Tensor Iota(int64_t n, float start = 0) {
  Tensor t = Tensor::Empty(DType::kF32, {n});
  auto* p = static_cast<float*>(t.data());
  for (int64_t i = 0; i < n; ++i) p[i] = start + static_cast<float>(i);
  return t;
}

std::vector<float> Values(const Tensor& t) {
  const auto* p = static_cast<const float*>(t.data());
  return std::vector<float>(p, p + t.numel());
}

StagingOptions Sync() {
  StagingOptions o;
  o.use_async_staging = false;
  o.use_non_blocking_copy = false;
  return o;
}

absl::StatusOr<StateDict> StageAndWait(AsyncStager& stager,
                                       const StateDict& sd) {
  Future<StateDict> f = stager.Stage(sd);
  const absl::StatusOr<StateDict>& r = f.Wait();
  if (!r.ok()) return r.status();
  DCP_RETURN_IF_ERROR(stager.SynchronizeStaging());
  return *r;
}

TEST(StagingOptionsTest, SeedDefaults) {
  StagingOptions d;
  EXPECT_TRUE(d.use_pinned_memory && d.use_shared_memory &&
              d.use_async_staging && d.use_non_blocking_copy);
  StagingOptions a = StagingOptions::AsyncSaveDefault();
  EXPECT_FALSE(a.use_pinned_memory || a.use_shared_memory ||
               a.use_async_staging || a.use_non_blocking_copy);
}

class StagerTest : public ::testing::Test {
 protected:
  std::unique_ptr<DeviceRuntime> runtime_ = CreateHostRuntime();
};

TEST_F(StagerTest, CpuTensorsAreSnapshots) {
  Tensor a = Iota(1000);
  Tensor b = Iota(3, 100);
  StateDict sd{{"model", StateDict{{"a", a}, {"b", b}}}};
  for (bool async : {false, true}) {
    StagingOptions o;
    o.use_async_staging = async;
    DefaultStager stager(o, runtime_.get());
    absl::StatusOr<StateDict> staged = StageAndWait(stager, sd);
    ASSERT_TRUE(staged.ok()) << staged.status();
    const Tensor& sa = staged->at("model").dict().at("a").tensor();
    EXPECT_TRUE(sa.device().is_cpu());
    EXPECT_NE(sa.data(), a.data());
    EXPECT_TRUE(sa.BytesEqual(a));
    static_cast<float*>(a.data())[0] = -1;  // The training loop moves on.
    static_cast<float*>(b.data())[2] = -1;
    EXPECT_EQ(Values(sa)[0], 0.0f);
    EXPECT_EQ(Values(staged->at("model").dict().at("b").tensor())[2], 102.0f);
    static_cast<float*>(a.data())[0] = 0;
    static_cast<float*>(b.data())[2] = 102;
  }
}

TEST_F(StagerTest, TensorUnderTwoKeysIsStagedOnce) {
  Tensor w = Iota(64);
  // Same memory, different shape: a different tensor.
  Tensor w_head = Tensor::Wrap(TensorView(w.data(), DType::kF32, {8}));
  StateDict sd{{"encoder.weight", w},
               {"decoder", StateDict{{"weight", w}}},
               {"head", w_head}};
  DefaultStager stager(Sync(), runtime_.get());
  absl::StatusOr<StateDict> staged = StageAndWait(stager, sd);
  ASSERT_TRUE(staged.ok()) << staged.status();
  const Tensor& s1 = staged->at("encoder.weight").tensor();
  const Tensor& s2 = staged->at("decoder").dict().at("weight").tensor();
  const Tensor& s3 = staged->at("head").tensor();
  EXPECT_EQ(s1.storage_id(), s2.storage_id());
  EXPECT_NE(s1.storage_id(), s3.storage_id());
  EXPECT_TRUE(s1.BytesEqual(w));
  EXPECT_EQ(s3.sizes(), Shape({8}));
  EXPECT_EQ(Values(s3), std::vector<float>({0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_F(StagerTest, PlainValuesAreCopied) {
  StateDict sd{{"step", int64_t{42}},
               {"lr", 0.5},
               {"flag", true},
               {"name", "adam"},
               {"blob", Bytes{std::string("\0\1\2", 3)}},
               {"list", StateList{int64_t{1}, "two", StateDict{{"x", 3.0}}}},
               {"none", StateValue()}};
  BlockingStager stager(StagingOptions::AsyncSaveDefault(), runtime_.get());
  absl::StatusOr<StateDict> staged = StageAndWait(stager, sd);
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(staged->at("step").int_value(), 42);
  EXPECT_EQ(staged->at("lr").double_value(), 0.5);
  EXPECT_TRUE(staged->at("flag").bool_value());
  EXPECT_EQ(staged->at("name").string_value(), "adam");
  EXPECT_EQ(staged->at("blob").bytes_value().data, std::string("\0\1\2", 3));
  const StateList& list = staged->at("list").list();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[1].string_value(), "two");
  EXPECT_EQ(list[2].dict().at("x").double_value(), 3.0);
  EXPECT_EQ(staged->at("none").kind(), StateValue::Kind::kNone);
}

TEST_F(StagerTest, EmptyAndScalarTensors) {
  Tensor empty = Tensor::Empty(DType::kF32, {0, 4});
  Tensor scalar = Tensor::Empty(DType::kI64, {});
  *static_cast<int64_t*>(scalar.data()) = -42;
  DefaultStager stager(Sync(), runtime_.get());
  absl::StatusOr<StateDict> staged =
      StageAndWait(stager, {{"empty", empty}, {"step", scalar}});
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(staged->at("empty").tensor().sizes(), Shape({0, 4}));
  EXPECT_EQ(staged->at("empty").tensor().nbytes(), 0u);
  EXPECT_TRUE(staged->at("empty").tensor().defined());
  const Tensor& s = staged->at("step").tensor();
  EXPECT_EQ(s.sizes(), Shape({}));
  EXPECT_EQ(*static_cast<const int64_t*>(s.data()), -42);
}

TEST_F(StagerTest, NonContiguousTensorsComeOutContiguous) {
  Tensor m = Iota(6);  // [[0,1,2],[3,4,5]]
  Tensor transposed = Tensor::Wrap(
      TensorView(m.data(), DType::kF32, {3, 2}, {1, 3}, Device::Cpu()));
  DefaultStager stager(Sync(), runtime_.get());
  absl::StatusOr<StateDict> staged = StageAndWait(stager, {{"t", transposed}});
  ASSERT_TRUE(staged.ok()) << staged.status();
  const Tensor& t = staged->at("t").tensor();
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_EQ(t.sizes(), Shape({3, 2}));
  EXPECT_EQ(Values(t), std::vector<float>({0, 3, 1, 4, 2, 5}));
}

TEST_F(StagerTest, ShardedTensorShardsAreStaged) {
  Tensor s0 = Iota(4, 0);
  Tensor s1 = Iota(4, 10);
  ShardedTensor st(DType::kF32, {8}, {Shard{{0}, s0}, Shard{{4}, s1}});
  DefaultStager stager(Sync(), runtime_.get());
  absl::StatusOr<StateDict> staged = StageAndWait(stager, {{"emb", st}});
  ASSERT_TRUE(staged.ok()) << staged.status();
  const ShardedTensor& out = staged->at("emb").sharded_tensor();
  EXPECT_EQ(out.global_sizes(), Shape({8}));
  ASSERT_EQ(out.local_shards().size(), 2u);
  EXPECT_EQ(out.local_shards()[1].offsets, Shape({4}));
  EXPECT_NE(out.local_shards()[1].tensor.data(), s1.data());
  EXPECT_TRUE(out.local_shards()[1].tensor.BytesEqual(s1));
  static_cast<float*>(s1.data())[0] = -5;
  EXPECT_EQ(Values(out.local_shards()[1].tensor)[0], 10.0f);
}

// Device tensors of the host runtime, filled with a pattern.
class DeviceTensors {
 public:
  explicit DeviceTensors(DeviceRuntime& runtime) : runtime_(runtime) {}
  ~DeviceTensors() {
    for (void* p : blocks_) runtime_.FreeDevice(p).IgnoreError();
  }
  Tensor Make(int64_t n, float start) {
    Tensor host = Iota(n, start);
    void* p = *runtime_.AllocateDevice(0, host.nbytes());
    blocks_.push_back(p);
    EXPECT_TRUE(
        runtime_.Copy(p, host.data(), host.nbytes(), CopyKind::kHostToDevice)
            .ok());
    return Tensor::Wrap(TensorView(p, DType::kF32, {n}, Device::Cuda(0)));
  }

 private:
  DeviceRuntime& runtime_;
  std::vector<void*> blocks_;
};

// Device tensors carved out of device blocks at chosen offsets, the bytes of
// each block a pattern, and the device-to-host copies a runtime performs.
class PackedDeviceState {
 public:
  PackedDeviceState() {
    HostRuntimeOptions options;
    options.copy_observer = [this](const HostCopyTrace& t) {
      if (t.phase == HostCopyTrace::Phase::kStart &&
          t.kind == CopyKind::kDeviceToHost && t.stream != nullptr) {
        copies_.fetch_add(1);
      }
    };
    runtime_ = CreateHostRuntime(std::move(options));
  }
  ~PackedDeviceState() {
    for (void* p : blocks_) runtime_->FreeDevice(p).IgnoreError();
  }
  DeviceRuntime& runtime() { return *runtime_; }
  int copies() const { return copies_.load(); }

  // A new device block of `bytes`, filled with bytes that depend on their
  // position (and the block's number).
  std::byte* Block(size_t bytes) {
    std::vector<std::byte> host(bytes);
    for (size_t i = 0; i < bytes; ++i) {
      host[i] = static_cast<std::byte>((i * 131 + blocks_.size() * 7) >> 3);
    }
    void* p = *runtime_->AllocateDevice(0, bytes);
    EXPECT_TRUE(
        runtime_->Copy(p, host.data(), bytes, CopyKind::kHostToDevice).ok());
    blocks_.push_back(p);
    hosts_.push_back(std::move(host));
    return static_cast<std::byte*>(p);
  }
  // A device tensor of `shape` at `offset` of block `block`.
  Tensor At(size_t block, size_t offset, DType dtype, Shape shape) {
    return Tensor::Wrap(
        TensorView(static_cast<std::byte*>(blocks_[block]) + offset, dtype,
                   std::move(shape), Device::Cuda(0)));
  }
  // Whether `staged` holds the bytes of `device` (a tensor made by At).
  bool Holds(const Tensor& staged, const Tensor& device) const {
    for (size_t b = 0; b < blocks_.size(); ++b) {
      const auto* base = static_cast<const std::byte*>(blocks_[b]);
      const auto* at = static_cast<const std::byte*>(device.data());
      if (at >= base && at < base + hosts_[b].size()) {
        return staged.nbytes() == device.nbytes() &&
               std::memcmp(staged.data(), hosts_[b].data() + (at - base),
                           device.nbytes()) == 0;
      }
    }
    return false;
  }

 private:
  std::atomic<int> copies_{0};
  std::unique_ptr<DeviceRuntime> runtime_;
  std::vector<void*> blocks_;
  std::vector<std::vector<std::byte>> hosts_;
};

// Many small tensors of one allocation, 512-byte rounded as a caching
// allocator places them (a 0-d step, bf16 and fp32 vectors, an int64
// tensor), stage in one copy and come out byte for byte; a tensor of a
// second allocation and a large one are copied by themselves.
TEST(StagerCoalesceTest, NeighboursInOneAllocationShareOneCopy) {
  PackedDeviceState device;
  device.Block(8 << 20);
  device.Block(4096);
  StateDict sd;
  std::vector<std::pair<std::string, Tensor>> tensors;
  size_t offset = 0;
  for (int i = 0; i < 40; ++i) {
    const DType dtype =
        i % 4 == 0 ? DType::kF32 : (i % 4 == 1 ? DType::kBF16 : DType::kI64);
    const Shape shape = i % 4 == 0 ? Shape{} : Shape{1 + 97 * i};
    Tensor t = device.At(0, offset, dtype, shape);
    offset += (t.nbytes() + 511) / 512 * 512;
    tensors.emplace_back(absl::StrCat("small", i), t);
  }
  tensors.emplace_back("large", device.At(0, 2 << 20, DType::kF32, {1 << 20}));
  tensors.emplace_back("other", device.At(1, 0, DType::kF32, {100}));
  for (auto& [name, t] : tensors) sd.emplace(name, t);
  for (bool coalesce : {true, false}) {
    StagingOptions o = Sync();
    o.coalesce_device_copies = coalesce;
    DefaultStager stager(o, &device.runtime());
    const int before = device.copies();
    absl::StatusOr<StateDict> staged = StageAndWait(stager, sd);
    ASSERT_TRUE(staged.ok()) << staged.status();
    for (const auto& [name, t] : tensors) {
      const Tensor& s = staged->at(name).tensor();
      EXPECT_TRUE(s.device().is_cpu()) << name;
      EXPECT_EQ(s.sizes(), t.sizes()) << name;
      EXPECT_TRUE(device.Holds(s, t)) << name << " coalesce=" << coalesce;
    }
    // One copy for the 40 neighbours, one for the large tensor (one
    // 64 MiB piece), one for the other allocation's tensor.
    EXPECT_EQ(device.copies() - before, coalesce ? 3 : 42);
  }
}

// Neighbours farther apart than the gap limit are copied alone; a span
// carries at most its tensors' bytes plus the gap limit in gaps, so tiny
// tensors 60 KiB apart pair up but no more; a tensor at the end of one
// allocation and one at the start of the next never share a copy,
// wherever the allocations lie.
TEST(StagerCoalesceTest, FarNeighboursAndOtherAllocationsAreCopiedAlone) {
  PackedDeviceState device;
  device.Block(1 << 20);
  device.Block(4096);
  device.Block(4096);
  StateDict sd{
      {"a", device.At(0, 0, DType::kF32, {1024})},
      // After a gap of 128 KiB: too far.
      {"b", device.At(0, 4096 + (128 << 10), DType::kF32, {1024})},
      {"end_of_1", device.At(1, 4096 - 256, DType::kF32, {64})},
      {"start_of_2", device.At(2, 0, DType::kF32, {64})},
  };
  for (int i = 0; i < 4; ++i) {  // Two spans of two.
    sd.emplace(absl::StrCat("tiny", i),
               device.At(0, (512 << 10) + i * (60 << 10), DType::kF32, {}));
  }
  DefaultStager stager(Sync(), &device.runtime());
  absl::StatusOr<StateDict> staged = StageAndWait(stager, sd);
  ASSERT_TRUE(staged.ok()) << staged.status();
  for (const auto& [name, value] : sd) {
    EXPECT_TRUE(device.Holds(staged->at(name).tensor(), value.tensor()))
        << name;
  }
  EXPECT_EQ(device.copies(), 6);
}

// The default, asynchronous and non-blocking path stages coalesced
// tensors too, and a second Stage reuses the layout's buffer.
TEST(StagerCoalesceTest, AsyncNonBlockingStagingOfNeighbours) {
  PackedDeviceState device;
  device.Block(1 << 20);
  StateDict sd;
  for (int i = 0; i < 16; ++i) {
    sd.emplace(absl::StrCat("t", i),
               device.At(0, i * 4096, DType::kF32, {1000 - i}));
  }
  DefaultStager stager(StagingOptions(), &device.runtime());
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<StateDict> staged = StageAndWait(stager, sd);
    ASSERT_TRUE(staged.ok()) << staged.status();
    for (const auto& [name, value] : sd) {
      EXPECT_TRUE(device.Holds(staged->at(name).tensor(), value.tensor()))
          << name << " round " << round;
    }
  }
  EXPECT_EQ(device.copies(), 2);
}

// Reserve maps (and pins) the staging memory up front: the first Stage of
// the same state, and later ones, map nothing; a larger state still gets
// memory of its own. On the background thread with async staging.
TEST_F(StagerTest, ReserveMakesTheMemoryTheFirstStageUses) {
  DeviceTensors device(*runtime_);
  StateDict sd{{"w", device.Make(100000, 1)}, {"b", Iota(1000)}};
  for (bool async : {false, true}) {
    StagingOptions o;
    o.use_async_staging = async;
    DefaultStager stager(o, runtime_.get());
    ASSERT_TRUE(stager.Reserve(sd).Wait().ok());
    EXPECT_EQ(stager.buffers_made(), 1);
    EXPECT_GE(stager.cached_bytes(), 404000u);
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<StateDict> staged = StageAndWait(stager, sd);
      ASSERT_TRUE(staged.ok()) << staged.status();
      EXPECT_EQ(Values(staged->at("w").tensor()), Values(Iota(100000, 1)));
      EXPECT_TRUE(staged->at("b").tensor().BytesEqual(sd.at("b").tensor()));
      // Pinned on Reserve: registering it again is refused.
      EXPECT_EQ(
          runtime_->RegisterHost(staged->at("w").tensor().data(), 64).code(),
          absl::StatusCode::kAlreadyExists);
    }
    EXPECT_EQ(stager.buffers_made(), 1) << "async=" << async;
    StateDict larger = sd;
    larger.emplace("extra", Iota(5000));
    ASSERT_TRUE(StageAndWait(stager, larger).ok());
    EXPECT_EQ(stager.buffers_made(), 2);
  }
}

TEST_F(StagerTest, ReserveAfterCloseFailsAndWithoutCacheDoesNothing) {
  StateDict sd{{"b", Iota(1000)}};
  StagingOptions uncached = Sync();
  uncached.cache_staged_state_dict = false;
  DefaultStager nothing_kept(uncached, runtime_.get());
  ASSERT_TRUE(nothing_kept.Reserve(sd).Wait().ok());
  EXPECT_EQ(nothing_kept.buffers_made(), 0);
  DefaultStager closed(Sync(), runtime_.get());
  closed.Close();
  EXPECT_EQ(closed.Reserve(sd).Wait().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(StagerTest, DeviceTensorsCopyOverSeveralStreamsByteExact) {
  DeviceTensors device(*runtime_);
  Tensor big = device.Make(100000, 1);  // 400 KB in 4 KiB pieces.
  Tensor small = device.Make(3, 7);
  Tensor strided = Tensor::Wrap(
      TensorView(big.data(), DType::kF32, {5, 2}, {10, 3}, Device::Cuda(0)));
  StagingOptions o;
  o.num_streams = 3;
  o.copy_chunk_bytes = 4096;
  DefaultStager stager(o, runtime_.get());
  absl::StatusOr<StateDict> staged = StageAndWait(
      stager, {{"big", big}, {"small", small}, {"strided", strided}});
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(Values(staged->at("big").tensor()), Values(Iota(100000, 1)));
  EXPECT_EQ(Values(staged->at("small").tensor()),
            std::vector<float>({7, 8, 9}));
  EXPECT_TRUE(staged->at("big").tensor().device().is_cpu());
  // Elements at 10*i + 3*j, plus one.
  EXPECT_EQ(Values(staged->at("strided").tensor()),
            std::vector<float>({1, 4, 11, 14, 21, 24, 31, 34, 41, 44}));
}

// Holds the D2H copy into the staging buffer until opened.
struct CopyHold {
  absl::Notification arrived;
  absl::Notification open;
  std::atomic<bool> armed{true};
  void Observe(const HostCopyTrace& t) {
    if (t.kind != CopyKind::kDeviceToHost ||
        t.phase != HostCopyTrace::Phase::kStart || !armed.exchange(false)) {
      return;
    }
    arrived.Notify();
    open.WaitForNotification();
  }
};

// A host runtime whose first D2H copy waits at `hold`, and one device tensor.
class StagerAsyncTest : public ::testing::Test {
 protected:
  CopyHold hold;
  std::unique_ptr<DeviceRuntime> runtime = CreateHostRuntime([this] {
    HostRuntimeOptions ro;
    ro.copy_observer = [this](const HostCopyTrace& t) { hold.Observe(t); };
    return ro;
  }());
  DeviceTensors device{*runtime};
  Tensor t = device.Make(5000, 3);
};

TEST_F(StagerAsyncTest, AsyncStageReturnsBeforeCopiesFinish) {
  StagingOptions o;  // Seed defaults: async.
  DefaultStager stager(o, runtime.get());
  EXPECT_FALSE(stager.should_synchronize_after_execute());
  Future<StateDict> f = stager.Stage({{"w", t}});
  hold.arrived.WaitForNotification();
  EXPECT_FALSE(f.ready());  // The copy is held: staging is not complete.
  hold.open.Notify();
  ASSERT_TRUE(f.Wait().ok()) << f.Wait().status();
  EXPECT_EQ(Values(f.Wait()->at("w").tensor()), Values(Iota(5000, 3)));
  EXPECT_TRUE(stager.SynchronizeStaging().ok());
}

// The staged future's callbacks run on the stager's thread once the stage is
// done: one may call SynchronizeStaging (the seed's pattern) without
// waiting for itself.
TEST_F(StagerAsyncTest, ACallbackOfTheStagedFutureMaySynchronize) {
  StagingOptions o;  // Seed defaults: async.
  DefaultStager stager(o, runtime.get());
  Future<StateDict> f = stager.Stage({{"w", t}});
  hold.arrived.WaitForNotification();  // Not done before the callback is on.
  absl::Notification called;
  absl::Status synchronized = absl::UnknownError("not called");
  f.OnReady([&](const absl::StatusOr<StateDict>& staged) {
    synchronized = staged.ok() ? stager.SynchronizeStaging() : staged.status();
    called.Notify();
  });
  hold.open.Notify();
  called.WaitForNotification();
  EXPECT_TRUE(synchronized.ok()) << synchronized;
}

TEST_F(StagerAsyncTest, NonBlockingCopyNeedsSynchronizeStaging) {
  StagingOptions o;
  o.use_async_staging = false;  // Non-blocking copies stay on.
  DefaultStager stager(o, runtime.get());
  EXPECT_TRUE(stager.should_synchronize_after_execute());
  Future<StateDict> f = stager.Stage({{"w", t}});
  ASSERT_TRUE(f.ready());  // Returned while the copy is still held.
  ASSERT_TRUE(f.Wait().ok());
  hold.arrived.WaitForNotification();
  hold.open.Notify();
  ASSERT_TRUE(stager.SynchronizeStaging().ok());
  EXPECT_EQ(Values(f.Wait()->at("w").tensor()), Values(Iota(5000, 3)));
}

TEST_F(StagerTest, CachedMemoryIsReusedOnlyWhenFree) {
  Tensor a = Iota(10000);
  DefaultStager stager(Sync(), runtime_.get());
  const void* first_data = nullptr;
  const void* second_data = nullptr;
  {
    absl::StatusOr<StateDict> s1 = StageAndWait(stager, {{"a", a}});
    ASSERT_TRUE(s1.ok());
    first_data = s1->at("a").tensor().data();
    // While s1 lives, a second save gets other memory.
    static_cast<float*>(a.data())[0] = 77;
    absl::StatusOr<StateDict> s2 = StageAndWait(stager, {{"a", a}});
    ASSERT_TRUE(s2.ok());
    second_data = s2->at("a").tensor().data();
    EXPECT_NE(second_data, first_data);
    EXPECT_EQ(Values(s1->at("a").tensor())[0], 0.0f);
    EXPECT_EQ(Values(s2->at("a").tensor())[0], 77.0f);
  }
  EXPECT_GT(stager.cached_bytes(), 0u);
  absl::StatusOr<StateDict> s3 = StageAndWait(stager, {{"a", a}});
  ASSERT_TRUE(s3.ok());
  const void* reused = s3->at("a").tensor().data();
  // Both earlier dicts are gone: a cached buffer is reused rather than
  // mapping a new one.
  EXPECT_TRUE(reused == first_data || reused == second_data);
  EXPECT_TRUE(s3->at("a").tensor().BytesEqual(a));
  stager.Close();
  EXPECT_EQ(stager.cached_bytes(), 0u);
  EXPECT_TRUE(s3->at("a").tensor().BytesEqual(a));  // Still valid.
}

TEST_F(StagerTest, OverlappingSavesAlternateBetweenTwoCachedBuffers) {
  Tensor a = Iota(10000);
  static_cast<float*>(a.data())[1] = 0;  // Save k stages the value k.
  DefaultStager stager(Sync(), runtime_.get());
  // Each save's staged dict lives until the next save's has been made, as
  // when every AsyncSave is issued while the last upload still runs.
  absl::StatusOr<StateDict> previous = StageAndWait(stager, {{"a", a}});
  ASSERT_TRUE(previous.ok());
  std::set<const void*> memory = {previous->at("a").tensor().data()};
  for (int save = 1; save < 6; ++save) {
    static_cast<float*>(a.data())[1] = static_cast<float>(save);
    absl::StatusOr<StateDict> next = StageAndWait(stager, {{"a", a}});
    ASSERT_TRUE(next.ok());
    EXPECT_NE(next->at("a").tensor().data(), previous->at("a").tensor().data());
    EXPECT_EQ(Values(previous->at("a").tensor())[1],
              static_cast<float>(save - 1));
    EXPECT_TRUE(next->at("a").tensor().BytesEqual(a));
    memory.insert(next->at("a").tensor().data());
    previous = std::move(next);
  }
  // Two buffers served all six saves.
  EXPECT_EQ(memory.size(), 2u);

  // With one cached buffer, every overlapping save maps memory anew.
  StagingOptions one = Sync();
  one.max_cached_buffers = 1;
  DefaultStager single(one, runtime_.get());
  absl::StatusOr<StateDict> held = StageAndWait(single, {{"a", a}});
  ASSERT_TRUE(held.ok());
  for (int save = 0; save < 3; ++save) {
    absl::StatusOr<StateDict> next = StageAndWait(single, {{"a", a}});
    ASSERT_TRUE(next.ok());
    EXPECT_NE(next->at("a").tensor().data(), held->at("a").tensor().data());
  }
  EXPECT_GE(single.cached_bytes(), 10000 * sizeof(float));
  EXPECT_EQ(stager.cached_bytes(), 2 * single.cached_bytes());
}

TEST_F(StagerTest, StagerPerSaveReusesTheLastStagersMemory) {
  ReleaseSpareHostBuffers();
  Tensor a = Iota(100000);
  const void* first = nullptr;
  {
    DefaultStager stager(StagingOptions::AsyncSaveDefault(), runtime_.get());
    absl::StatusOr<StateDict> staged = StageAndWait(stager, {{"a", a}});
    ASSERT_TRUE(staged.ok());
    first = staged->at("a").tensor().data();
  }
  static_cast<float*>(a.data())[5] = -3;
  DefaultStager next(StagingOptions::AsyncSaveDefault(), runtime_.get());
  absl::StatusOr<StateDict> staged = StageAndWait(next, {{"a", a}});
  ASSERT_TRUE(staged.ok());
  EXPECT_EQ(staged->at("a").tensor().data(), first);
  EXPECT_TRUE(staged->at("a").tensor().BytesEqual(a));
  ReleaseSpareHostBuffers();
}

TEST_F(StagerTest, PinnedStagingMemoryIsRegistered) {
  Tensor a = Iota(5000);
  StagingOptions o = Sync();
  o.use_shared_memory = false;
  DefaultStager stager(o, runtime_.get());
  absl::StatusOr<StateDict> staged = StageAndWait(stager, {{"a", a}});
  ASSERT_TRUE(staged.ok());
  EXPECT_EQ(runtime_->RegisterHost(staged->at("a").tensor().data(), 64).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(StagerTest, ErrorsNameTheTensor) {
  std::vector<float> host(4);
  Tensor far =
      Tensor::Wrap(TensorView(host.data(), DType::kF32, {4}, Device::Cuda(5)));
  DefaultStager stager(Sync(), runtime_.get());
  absl::StatusOr<StateDict> staged =
      StageAndWait(stager, {{"opt", StateDict{{"m", far}}}});
  EXPECT_EQ(staged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(staged.status().message(), HasSubstr("'opt.m'"));
  EXPECT_THAT(staged.status().message(), HasSubstr("cuda:5"));

  Tensor no_data =
      Tensor::Wrap(TensorView(nullptr, DType::kF32, {4}, Device::Cpu()));
  staged = StageAndWait(stager, {{"x", no_data}});
  EXPECT_EQ(staged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(staged.status().message(), HasSubstr("no data"));

  stager.Close();
  staged = StageAndWait(stager, {{"y", Iota(2)}});
  EXPECT_EQ(staged.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StagerFaultTest, CopyFaultReachesTheFuture) {
  HostRuntimeOptions ro;
  ro.copy_fault = [](const HostCopyTrace& t) {
    return t.kind == CopyKind::kDeviceToHost
               ? absl::InternalError("injected D2H fault")
               : absl::OkStatus();
  };
  auto runtime = CreateHostRuntime(ro);
  DeviceTensors device(*runtime);
  Tensor t = device.Make(1000, 0);
  DefaultStager stager(StagingOptions(), runtime.get());
  Future<StateDict> f = stager.Stage({{"w", t}});
  EXPECT_EQ(f.Wait().status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(f.Wait().status().message(), HasSubstr("injected D2H fault"));
  // The stager stays usable for CPU-only state.
  Future<StateDict> g = stager.Stage({{"c", Iota(4)}});
  EXPECT_TRUE(g.Wait().ok());
}

// Non-blocking copies of one Stage fail: the failure is that Stage's (its
// `released`, and SynchronizeStaging), never the next Stage's, which
// stages CPU tensors and succeeds whether or not the first copies landed
// before it began.
TEST(StagerFaultTest, AFailedNonBlockingCopyIsReportedToItsOwnStage) {
  HostRuntimeOptions ro;
  ro.copy_fault = [](const HostCopyTrace& t) {
    return t.kind == CopyKind::kDeviceToHost
               ? absl::InternalError("injected D2H fault")
               : absl::OkStatus();
  };
  auto runtime = CreateHostRuntime(ro);
  DeviceTensors device(*runtime);
  Tensor t = device.Make(1000, 0);
  StagingOptions o;
  o.use_async_staging = false;  // Non-blocking copies stay on.
  DefaultStager stager(o, runtime.get());
  Promise<void> first_released;
  Future<StateDict> first =
      stager.StageReleasing({{"w", t}}, DeviceWait{}, first_released);
  ASSERT_TRUE(first.Wait().ok());  // Returned with the copy in flight.
  Promise<void> second_released;
  Future<StateDict> second =
      stager.StageReleasing({{"c", Iota(4)}}, DeviceWait{}, second_released);
  ASSERT_TRUE(second.Wait().ok()) << second.Wait().status();
  EXPECT_TRUE(second_released.future().Wait().ok())
      << second_released.future().Wait();
  EXPECT_EQ(Values(second.Wait()->at("c").tensor()), Values(Iota(4)));
  const absl::Status failed = first_released.future().Wait();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("injected D2H fault"));
  // The seed's contract: SynchronizeStaging reports it too, once.
  const absl::Status synchronized = stager.SynchronizeStaging();
  EXPECT_THAT(synchronized.message(), HasSubstr("injected D2H fault"));
  EXPECT_TRUE(stager.SynchronizeStaging().ok());
}

TEST(StagerRuntimeTest, CreatesItsOwnRuntimeWhenNoneIsGiven) {
  Tensor a = Iota(100);
  absl::StatusOr<StateDict> staged;
  {
    DefaultStager stager;  // Seed defaults, auto runtime.
    staged = StageAndWait(stager, {{"a", a}});
  }
  // The stager is gone; the staged dict (and its pinned memory) lives on.
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_TRUE(staged->at("a").tensor().BytesEqual(a));
}

}  // namespace
}  // namespace dcp
