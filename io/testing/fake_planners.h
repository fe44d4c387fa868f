// Test doubles for the storage layer: a SavePlanner that serves data from
// in-memory tensors and byte strings, a LoadPlanner that receives into
// caller-provided tensors and a byte map, and helpers that drive a
// StorageWriter/StorageReader through the engine's single-rank sequence.
// They stand in for planner/'s DefaultSavePlanner/DefaultLoadPlanner so io/
// tests do not depend on them.
#ifndef DCP_IO_TESTING_FAKE_PLANNERS_H_
#define DCP_IO_TESTING_FAKE_PLANNERS_H_

#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/tensor.h"
#include "io/storage.h"
#include "planner/metadata.h"
#include "planner/plan.h"
#include "planner/planner.h"

namespace dcp::testing {

class FakeSavePlanner final : public SavePlanner {
 public:
  // A whole tensor saved as one chunk (offset all zeros).
  void AddTensor(const std::string& fqn, Tensor tensor);
  // One chunk of a tensor of shape `global` at `offsets`.
  void AddShard(const std::string& fqn, Shape global, Shape offsets,
                Tensor chunk);
  // A non-tensor value.
  void AddBytes(const std::string& fqn, std::string bytes);

  // The plan of every item added, in fqn/offset order.
  SavePlan Plan() const;
  // The global metadata of every item added (storage_data empty).
  Metadata GlobalMetadata() const;

  absl::Status SetUp(const StateDict&, const StorageMeta&, bool) override {
    return absl::OkStatus();
  }
  absl::StatusOr<SavePlan> CreateLocalPlan() override { return Plan(); }
  absl::StatusOr<std::pair<std::vector<SavePlan>, Metadata>> CreateGlobalPlan(
      std::vector<SavePlan> local_plans) override {
    return std::make_pair(std::move(local_plans), GlobalMetadata());
  }
  absl::StatusOr<SavePlan> FinishPlan(SavePlan plan) override { return plan; }
  absl::StatusOr<WriteValue> ResolveData(const WriteItem& item) override;

 private:
  struct Entry {
    WriteItem item;
    WriteValue data;
  };
  std::map<MetadataIndex, Entry> entries_;
  std::map<std::string, TensorStorageMetadata> tensors_;
};

class FakeLoadPlanner final : public LoadPlanner {
 public:
  // The tensor that ReadItems with `dest_index` copy into.
  void SetDestination(const MetadataIndex& dest_index, Tensor tensor);

  // The bytes values delivered so far, by fqn.
  std::map<std::string, std::string> bytes() const;
  // How many CommitTensor calls there were.
  int commits() const { return commits_.load(); }

  absl::Status SetUp(StateDict*, const Metadata&, bool) override {
    return absl::OkStatus();
  }
  absl::StatusOr<LoadPlan> CreateLocalPlan() override { return LoadPlan{}; }
  absl::StatusOr<std::vector<LoadPlan>> CreateGlobalPlan(
      std::vector<LoadPlan> plans) override {
    return plans;
  }
  absl::StatusOr<LoadPlan> FinishPlan(LoadPlan plan) override { return plan; }
  absl::Status LoadBytes(const ReadItem& item,
                         absl::string_view bytes) override;
  absl::StatusOr<TensorView> ResolveTensor(const ReadItem& item) override;
  absl::Status CommitTensor(const ReadItem& item,
                            const TensorView& tensor) override;

 private:
  std::map<MetadataIndex, Tensor> destinations_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> bytes_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> commits_{0};
};

// A ReadItem per stored item of `metadata` that reads it whole into the
// destination with the same index (tensors) or the same fqn (bytes).
LoadPlan WholeItemLoadPlan(const Metadata& metadata);

// Drives `writer` through Reset (keeping its path), SelectRankLocal (with
// `rank_local`), SetUp (coordinator, rank 0), the plan steps, WriteData,
// Finish and MarkCommitted; on any failure calls Abort (unless
// `abort_on_failure` is false: a simulated crash) and returns the error.
absl::Status SaveOneRank(StorageWriter& writer, FakeSavePlanner& planner,
                         bool abort_on_failure = true,
                         std::optional<int> rank_local = std::nullopt);

// ReadMetadata, SetUp and ReadData of `plan` (the whole-item plan when null).
absl::Status LoadOneRank(StorageReader& reader, LoadPlanner& planner,
                         const LoadPlan* plan = nullptr);

// A host tensor of `dtype` and `sizes` whose bytes are a function of `seed`.
Tensor PatternTensor(DType dtype, Shape sizes, uint32_t seed);

}  // namespace dcp::testing

#endif  // DCP_IO_TESTING_FAKE_PLANNERS_H_
