// A synthetic model state for the demo and the benchmarks: mixed dtypes
// (F32, BF16, I64), a nested optimizer-like state, row-sharded tensors and a
// few plain values, filled deterministically from a seed so that a later
// process can regenerate the expected bytes and check a load against them.
#ifndef DCP_TOOLS_SYNTHETIC_STATE_H_
#define DCP_TOOLS_SYNTHETIC_STATE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/state_dict.h"

namespace dcp {

struct SyntheticStateOptions {
  int64_t total_bytes = int64_t{1} << 30;  // Approximate, across all ranks.
  uint64_t seed = 1;
  int rank = 0;
  int world_size = 1;
  // true: tensors hold the seeded bytes; false: zero-filled tensors of the
  // same layout (a load destination).
  bool fill = true;
};

// Builds this rank's part of the synthetic state. Large weights are
// ShardedTensors split by rows across ranks; small tensors and plain values
// are replicated on every rank.
StateDict MakeSyntheticState(const SyntheticStateOptions& options);

// The flattened name of a tensor whose shape, [rows, 1024], gives the size
// of the synthetic state it belongs to (rows grow with total_bytes).
inline constexpr char kSyntheticSizeTensor[] = "model.layers.0.weight";

// The global shape of kSyntheticSizeTensor in the state of `total_bytes`.
Shape SyntheticSizeTensorShape(int64_t total_bytes);

// A total_bytes for which MakeSyntheticState builds kSyntheticSizeTensor
// with the global shape `shape` (so the same state, whatever total_bytes it
// was made with). kInvalidArgument when no total_bytes gives that shape,
// or the state's bytes would not fit in int64 (a checkpoint's shapes are
// untrusted).
absl::StatusOr<int64_t> SyntheticTotalBytesForShape(const Shape& shape);

// Total bytes of tensor data in `state` on this rank.
int64_t StateTensorBytes(const StateDict& state);

// Compares every tensor byte and plain value of `actual` against `expected`
// (same layout). OK, or kDataLoss naming the first differing key and offset.
absl::Status CompareStates(const StateDict& expected, const StateDict& actual);

// Checks `actual` (a loaded state of `options`' layout) against the values
// MakeSyntheticState(options) generates, without building them: tensors are
// regenerated 8 MiB at a time, so a check costs no second copy of the state.
// OK, or kDataLoss naming the first differing key and offset.
absl::Status VerifySyntheticState(const StateDict& actual,
                                  const SyntheticStateOptions& options);

}  // namespace dcp

#endif  // DCP_TOOLS_SYNTHETIC_STATE_H_
