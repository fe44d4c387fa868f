// The subcommands of the dcp command line, as functions so tests can call
// them. Each prints to stdout and returns a Status describing any failure.
#ifndef DCP_TOOLS_COMMANDS_H_
#define DCP_TOOLS_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/metadata.h"

namespace dcp {

// `dcp demo`'s flags, as typed (RunDemo parses and checks them).
struct DemoFlags {
  // ParseSize's syntax. Empty: 1GiB to save; with --mode load, the size of
  // the state the checkpoint in `dir` holds.
  std::string size;
  std::string dir;         // Empty: a temporary directory, removed afterwards.
  std::string seed = "1";  // ParseSeed's syntax.
  std::string mode = "roundtrip";
  bool json = false;
  bool cold_load = true;
  // ParseCompression's syntax (io/extensions.h): none, zstd, zstd:LEVEL.
  std::string compression = "none";
};

// Parses "1GiB", "256MiB", "1.5TiB", "4G", "1000000" (bytes): digits, an
// optional fraction, and an optional unit B, K/KiB/KB, M/MiB/MB, G/GiB/GB
// or T/TiB/TB (any case; all powers of 1024). kInvalidArgument for any
// other text and for a size of 2^63 bytes or more (never a wrapped value).
absl::StatusOr<int64_t> ParseSize(const std::string& text);

// Parses a seed: decimal digits only, 0 to 2^64 - 1; kInvalidArgument
// otherwise (never a saturated value).
absl::StatusOr<uint64_t> ParseSeed(const std::string& text);

// Builds the synthetic state (tools/synthetic_state.h), saves and/or loads
// it, checks every byte and prints throughput. kInvalidArgument for a bad
// size or seed, and for a state whose share on each rank, held once to
// save and twice to load (the loaded state and the expected one), exceeds
// this machine's memory (MemTotalBytes): refused before anything is
// allocated. --mode load without a size takes it from the checkpoint's
// metadata (kInvalidArgument when it holds no synthetic state); with a size
// that is not the checkpoint's, kInvalidArgument naming both.
absl::Status RunDemo(const DemoFlags& flags);
// A source the inspect, verify and convert commands refuse before reading:
// kFailedPrecondition for a plain path to a file (a data file or
// `.metadata` passed for its checkpoint; a torch.save file, naming the
// conversion), kUnimplemented for a directory torch.distributed.checkpoint
// wrote (naming the conversion). OK otherwise (URIs, absent paths: the
// readers say what is wrong).
absl::Status RefuseNonCheckpointSource(const std::string& id);
// `dcp inspect DIR` / `dcp verify DIR`: a dcp checkpoint, or a Hugging Face
// directory (IsHfCheckpointDirectory) through the *Hf variants.
absl::Status RunInspect(const std::string& dir);
absl::Status RunVerify(const std::string& dir);
// "tensor NAME has shape S but its chunks hold N of its M elements" for each
// tensor of `metadata` that its chunks do not cover (the decoder checks
// that they are disjoint and inside it, not that they cover it; a load
// refuses the elements none holds). None for a rank-local save, each of
// whose ranks holds its own part.
std::vector<std::string> UncoveredTensors(const Metadata& metadata);
// True when `dir` holds no dcp metadata file and ResolveHfCheckpointFiles
// finds safetensors files there.
bool IsHfCheckpointDirectory(const std::string& dir);
// Lists tensors (dtype, shape, file), files and total sizes; kDataLoss
// naming the file and the rule for a header that breaks the format.
absl::Status RunInspectHf(const std::string& dir);
// Checks every file against the safetensors rules (io/safetensors.h), the
// index against the files (every tensor named where it lies, no file
// missing), and the tensors across files; prints each problem, returns
// kDataLoss naming the first. A total_size that differs from the tensors'
// bytes is a note, not a problem (hub checkpoints disagree on it).
absl::Status RunVerifyHf(const std::string& dir);
// `dcp verify --clean DIR`, before the verification: takes the directory's
// lock (kFailedPrecondition naming the holder while a save runs), removes
// the orphans of interrupted saves (RemoveOrphans, io/
// file_system_storage.h), prints each name removed and the bytes
// reclaimed. The cleanup's error when orphans remain or none were looked
// for (kDataLoss when the committed metadata cannot be read).
absl::Status RunClean(const std::string& dir);

// The benchmark kinds `dcp bench` knows ("coord", "io", ...) and the Bazel
// target that builds each ("" for an unknown kind).
std::vector<std::string> BenchKinds();
std::string BenchTarget(const std::string& kind);

// Replaces this process with the benchmark program of `kind` (built next to
// dcp under bazel-bin/bench/); returns only on failure.
absl::Status RunBench(const std::string& kind,
                      const std::vector<std::string>& args);

}  // namespace dcp

#endif  // DCP_TOOLS_COMMANDS_H_
