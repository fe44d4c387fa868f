#include "io/testing/sample_state.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "io/file_system.h"

namespace dcp::testing {

SampleState SampleState::Make(uint32_t seed) {
  SampleState s;
  s.tensors["model.f32"] = PatternTensor(DType::kF32, {3, 5}, seed + 1);
  s.tensors["model.bf16"] = PatternTensor(DType::kBF16, {7}, seed + 2);
  s.tensors["model.i64"] = PatternTensor(DType::kI64, {2, 3, 4}, seed + 3);
  s.tensors["model.u8_scalar"] = PatternTensor(DType::kU8, {}, seed + 4);
  s.tensors["model.empty"] = PatternTensor(DType::kF64, {0, 4}, seed + 5);
  s.tensors["model.bool"] = PatternTensor(DType::kBool, {5}, seed + 6);
  s.tensors["big"] = PatternTensor(DType::kF16, {3000}, seed + 7);
  s.bytes["step"] = absl::StrCat("step-", seed);
  s.bytes["empty_value"] = "";
  return s;
}

FakeSavePlanner SampleState::SavePlanner() const {
  FakeSavePlanner planner;
  for (const auto& [fqn, t] : tensors) planner.AddTensor(fqn, t);
  for (const auto& [fqn, b] : bytes) planner.AddBytes(fqn, b);
  return planner;
}

std::map<std::string, Tensor> SampleState::Destinations(
    FakeLoadPlanner& planner) const {
  std::map<std::string, Tensor> out;
  for (const auto& [fqn, t] : tensors) {
    out[fqn] = Tensor::Empty(t.dtype(), t.sizes());
    planner.SetDestination(MetadataIndex(fqn, Shape(t.sizes().size(), 0)),
                           out[fqn]);
  }
  return out;
}

std::string NewTestDir(const std::string& name) {
  static int counter = 0;
  std::string dir =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, "_", counter++);
  LocalFileSystem().CreateDir(dir).IgnoreError();
  return dir;
}

std::vector<std::string> ListNames(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names =
      LocalFileSystem().ListDir(dir);
  return names.ok() ? *names : std::vector<std::string>{};
}

void FlipByte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c;
  f.read(&c, 1);
  c ^= 0x01;
  f.seekp(offset);
  f.write(&c, 1);
}

absl::Status SaveSample(const std::string& dir, const SampleState& sample,
                        FileSystemWriterOptions options,
                        bool abort_on_failure) {
  FileSystemWriter writer(dir, options);
  FakeSavePlanner planner = sample.SavePlanner();
  return SaveOneRank(writer, planner, abort_on_failure);
}

absl::Status LoadAndCompare(const std::string& dir, const SampleState& sample,
                            FileSystemReaderOptions options) {
  FileSystemReader reader(dir, options);
  FakeLoadPlanner planner;
  std::map<std::string, Tensor> loaded = sample.Destinations(planner);
  DCP_RETURN_IF_ERROR(LoadOneRank(reader, planner));
  for (const auto& [fqn, t] : sample.tensors) {
    if (!loaded[fqn].BytesEqual(t)) {
      return absl::InternalError(absl::StrCat("tensor ", fqn, " differs"));
    }
  }
  if (planner.bytes() != sample.bytes) {
    return absl::InternalError("byte values differ");
  }
  return absl::OkStatus();
}

}  // namespace dcp::testing
