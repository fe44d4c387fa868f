// dcp::Save and dcp::Load across two ranks (threads of this process) that
// coordinate through a StoreProcessGroup on one InMemoryKeyValueStore: the
// way a torchrun job coordinates through its TCPStore. The checkpoint is
// saved sharded by rows and loaded sharded by columns; every byte is
// checked.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/store_process_group.h"
#include "core/sharded_tensor.h"
#include "core/state_dict.h"
#include "core/tensor.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"

namespace dcp {
namespace {

using ::testing::ContainsRegex;
using ::testing::Not;

constexpr int kRanks = 2;
constexpr int64_t kRows = 8;
constexpr int64_t kCols = 6;

// The global "weight" (f32 [kRows, kCols]) element at (row, col).
float WeightAt(int64_t row, int64_t col) {
  return static_cast<float>(row * 1000 + col) + 0.25f;
}

// The block of "weight" at rows [row0, row0 + rows), cols [col0, col0 +
// cols), filled (fill) or zeroed.
Tensor WeightBlock(int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                   bool fill) {
  Tensor t = Tensor::Empty(DType::kF32, {rows, cols});
  auto* data = static_cast<float*>(t.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      data[r * cols + c] = fill ? WeightAt(row0 + r, col0 + c) : 0.0f;
    }
  }
  return t;
}

// A replicated "bias" of 5 i64 values.
Tensor Bias(bool fill) {
  Tensor t = Tensor::Empty(DType::kI64, {5});
  auto* data = static_cast<int64_t*>(t.data());
  for (int i = 0; i < 5; ++i) data[i] = fill ? -7 * i - 1 : 0;
  return t;
}

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir =
      std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Runs body(rank, group) on one thread per rank, each with its own rank of
// the group `name` on `store`.
void OnRanks(std::shared_ptr<comm::KeyValueStore> store,
             const std::string& name,
             const std::function<void(int, comm::ProcessGroup&)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = comm::CreateStoreProcessGroup(store, rank, kRanks,
                                                 {name, absl::Seconds(20)});
      ASSERT_TRUE(group.ok()) << group.status();
      body(rank, **group);
    });
  }
  for (std::thread& t : threads) t.join();
}

// A writer that cannot order device copies after the caller's stream (the
// StorageWriter default for SetDeviceWait); everything else forwards.
class NoDeviceWaitWriter final : public StorageWriter {
 public:
  explicit NoDeviceWaitWriter(const std::string& dir) : inner_(dir) {}
  absl::Status Reset(const std::string& checkpoint_id) override {
    return inner_.Reset(checkpoint_id);
  }
  StorageMeta GetStorageMeta() const override {
    return inner_.GetStorageMeta();
  }
  absl::Status SetUp(bool is_coordinator, int rank,
                     bool use_collectives) override {
    return inner_.SetUp(is_coordinator, rank, use_collectives);
  }
  absl::StatusOr<SavePlan> PrepareLocalPlan(SavePlan plan) override {
    return inner_.PrepareLocalPlan(std::move(plan));
  }
  absl::StatusOr<std::vector<SavePlan>> PrepareGlobalPlan(
      std::vector<SavePlan> plans) override {
    return inner_.PrepareGlobalPlan(std::move(plans));
  }
  Future<std::vector<WriteResult>> WriteData(const SavePlan& plan,
                                             SavePlanner& planner) override {
    return inner_.WriteData(plan, planner);
  }
  absl::Status Finish(
      const Metadata& metadata,
      const std::vector<std::vector<WriteResult>>& results) override {
    return inner_.Finish(metadata, results);
  }
  absl::Status MarkCommitted() override { return inner_.MarkCommitted(); }
  void Abort() override { inner_.Abort(); }

 private:
  FileSystemWriter inner_;
};

// One rank's writer refuses the save's device wait: that rank fails inside
// the plan exchange, so every rank fails naming it (none waits for it until
// the group's timeout), and nothing is committed.
TEST(StoreProcessGroupSaveTest, ARankThatRefusesTheDeviceWaitFailsEveryRank) {
  const std::string dir = FreshDir("store-group-refused-wait");
  auto store = std::make_shared<comm::InMemoryKeyValueStore>();
  OnRanks(store, "refused", [&](int rank, comm::ProcessGroup& group) {
    StateDict state;
    state["bias"] = Bias(/*fill=*/true);
    NoDeviceWaitWriter refusing(dir);
    FileSystemWriter accepting(dir);
    SaveOptions options;
    options.process_group = &group;
    options.storage_writer =
        rank == 1 ? static_cast<StorageWriter*>(&refusing) : &accepting;
    options.device_wait = DeviceWait::Stream(/*device=*/0, /*stream=*/nullptr);
    absl::StatusOr<Metadata> metadata = Save(state, options);
    ASSERT_FALSE(metadata.ok()) << "rank " << rank;
    EXPECT_EQ(metadata.status().code(), absl::StatusCode::kUnimplemented)
        << "rank " << rank << ": " << metadata.status();
    EXPECT_THAT(std::string(metadata.status().message()),
                ContainsRegex("rank 1.*device"))
        << "rank " << rank << ": " << metadata.status();
  });
  EXPECT_FALSE(std::filesystem::exists(dir + "/.metadata"));
}

// A reader whose DetectRankLocal fails (as one that cannot list its
// directory would), or that cannot order device copies (the StorageReader
// default for SetDeviceWait); everything else forwards.
class FaultyReader final : public StorageReader {
 public:
  FaultyReader(const std::string& dir, bool fail_detect)
      : inner_(dir), fail_detect_(fail_detect) {}
  absl::Status Reset(const std::string& checkpoint_id) override {
    return inner_.Reset(checkpoint_id);
  }
  absl::StatusOr<bool> DetectRankLocal(int rank) override {
    if (fail_detect_) {
      return absl::PermissionDeniedError("cannot list the checkpoint");
    }
    return inner_.DetectRankLocal(rank);
  }
  absl::StatusOr<Metadata> ReadMetadata() override {
    return inner_.ReadMetadata();
  }
  absl::Status SetUp(const Metadata& metadata, bool is_coordinator) override {
    return inner_.SetUp(metadata, is_coordinator);
  }
  absl::StatusOr<LoadPlan> PrepareLocalPlan(LoadPlan plan) override {
    return inner_.PrepareLocalPlan(std::move(plan));
  }
  absl::StatusOr<std::vector<LoadPlan>> PrepareGlobalPlan(
      std::vector<LoadPlan> plans) override {
    return inner_.PrepareGlobalPlan(std::move(plans));
  }
  Future<void> ReadData(const LoadPlan& plan, LoadPlanner& planner) override {
    return inner_.ReadData(plan, planner);
  }

 private:
  FileSystemReader inner_;
  const bool fail_detect_;
};

void SaveBias(const std::string& dir,
              std::shared_ptr<comm::KeyValueStore> store) {
  OnRanks(store, "bias", [&](int rank, comm::ProcessGroup& group) {
    StateDict state;
    state["bias"] = Bias(/*fill=*/true);
    SaveOptions options;
    options.checkpoint_id = dir;
    options.process_group = &group;
    absl::StatusOr<Metadata> metadata = Save(state, options);
    ASSERT_TRUE(metadata.ok()) << "rank " << rank << ": " << metadata.status();
  });
}

// One rank's reader fails before the plan exchange: that rank fails inside
// the load's shared setup step, so every rank fails naming it (none waits
// for it until the group's timeout).
TEST(StoreProcessGroupSaveTest, ARankWhoseReaderFailsDetectionFailsEveryRank) {
  const std::string dir = FreshDir("store-group-failed-detect");
  auto store = std::make_shared<comm::InMemoryKeyValueStore>();
  SaveBias(dir, store);
  OnRanks(store, "detect", [&](int rank, comm::ProcessGroup& group) {
    StateDict state;
    state["bias"] = Bias(/*fill=*/false);
    FaultyReader reader(dir, /*fail_detect=*/rank == 1);
    LoadOptions options;
    options.process_group = &group;
    options.storage_reader = &reader;
    absl::Status loaded = Load(state, options);
    EXPECT_EQ(loaded.code(), absl::StatusCode::kPermissionDenied)
        << "rank " << rank << ": " << loaded;
    EXPECT_THAT(std::string(loaded.message()),
                ContainsRegex("rank 1.*cannot list the checkpoint"))
        << "rank " << rank << ": " << loaded;
  });
}

// Only rank 1 loads into a device tensor, through a reader that cannot
// order its copies after the caller's stream: rank 1 refuses the wait, and
// every rank fails naming it. (The tensor's memory is never touched.)
TEST(StoreProcessGroupSaveTest,
     ARankThatRefusesTheLoadDeviceWaitFailsEveryRank) {
  const std::string dir = FreshDir("store-group-refused-load-wait");
  auto store = std::make_shared<comm::InMemoryKeyValueStore>();
  SaveBias(dir, store);
  OnRanks(store, "load-wait", [&](int rank, comm::ProcessGroup& group) {
    Tensor host = Bias(/*fill=*/false);
    StateDict state;
    state["bias"] = rank == 1
                        ? Tensor::Wrap(TensorView(host.data(), DType::kI64, {5},
                                                  Device::Cuda(0)))
                        : host;
    FaultyReader reader(dir, /*fail_detect=*/false);
    LoadOptions options;
    options.process_group = &group;
    options.storage_reader = &reader;
    options.device_wait = DeviceWait::Stream(/*device=*/0, /*stream=*/nullptr);
    absl::Status loaded = Load(state, options);
    EXPECT_EQ(loaded.code(), absl::StatusCode::kUnimplemented)
        << "rank " << rank << ": " << loaded;
    EXPECT_THAT(std::string(loaded.message()), ContainsRegex("rank 1.*device"))
        << "rank " << rank << ": " << loaded;
  });
}

TEST(StoreProcessGroupSaveTest, TwoRanksSaveByRowsAndLoadByColumns) {
  const std::string dir = FreshDir("store-group-checkpoint");
  auto store = std::make_shared<comm::InMemoryKeyValueStore>();

  OnRanks(store, "checkpoint", [&](int rank, comm::ProcessGroup& group) {
    const int64_t rows = kRows / kRanks;
    StateDict state;
    state["weight"] =
        ShardedTensor(DType::kF32, {kRows, kCols},
                      {Shard{{rank * rows, 0},
                             WeightBlock(rank * rows, rows, 0, kCols,
                                         /*fill=*/true)}});
    state["bias"] = Bias(/*fill=*/true);
    state["step"] = int64_t{42};
    SaveOptions options;
    options.checkpoint_id = dir;
    options.process_group = &group;
    absl::StatusOr<Metadata> metadata = Save(state, options);
    ASSERT_TRUE(metadata.ok()) << "rank " << rank << ": " << metadata.status();
  });

  // A new group of the same name loads it, split by columns instead.
  OnRanks(store, "checkpoint", [&](int rank, comm::ProcessGroup& group) {
    const int64_t cols = kCols / kRanks;
    StateDict state;
    state["weight"] = ShardedTensor(
        DType::kF32, {kRows, kCols},
        {Shard{{0, rank * cols},
               WeightBlock(0, kRows, rank * cols, cols, /*fill=*/false)}});
    state["bias"] = Bias(/*fill=*/false);
    state["step"] = int64_t{0};
    LoadOptions options;
    options.checkpoint_id = dir;
    options.process_group = &group;
    absl::Status loaded = Load(state, options);
    ASSERT_TRUE(loaded.ok()) << "rank " << rank << ": " << loaded;

    const Tensor& block =
        state["weight"].sharded_tensor().local_shards()[0].tensor;
    const auto* data = static_cast<const float*>(block.data());
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(data[r * cols + c], WeightAt(r, rank * cols + c))
            << "rank " << rank << " row " << r << " col " << c;
      }
    }
    const auto* bias =
        static_cast<const int64_t*>(state["bias"].tensor().data());
    for (int i = 0; i < 5; ++i) EXPECT_EQ(bias[i], -7 * i - 1);
    EXPECT_EQ(state["step"].int_value(), 42);
  });

  // What is left is what a peer might still have read when its group was
  // destroyed (today each group's last broadcast from the coordinator); no
  // key of joining is.
  EXPECT_LE(store->KeyCount(), 2u * kRanks);
  for (const std::string& key : store->Keys()) {
    EXPECT_THAT(key, Not(ContainsRegex("/(join|welcome|joined|ready)/")));
  }
}

}  // namespace
}  // namespace dcp
