// What the fuzz targets whose decoders read files (metadata, hf_index,
// sharding_info) share: a process-wide scratch directory and POSIX I/O
// engine, and the single-rank load of what a reader decoded.
#ifndef DCP_FUZZ_SCRATCH_H_
#define DCP_FUZZ_SCRATCH_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/state_dict.h"
#include "io/io_engine.h"
#include "io/storage.h"
#include "planner/metadata.h"

namespace dcp::fuzz {

struct Scratch {
  // Under $TEST_TMPDIR, else /dev/shm, else /tmp; removed at exit.
  std::string dir;
  // kPosix, two threads; shared by every load of the process.
  std::unique_ptr<IoEngine> engine;
};

// Made on the first call. Thread-compatible (targets run one input at a
// time).
Scratch& GetScratch();

// Replaces the file at `path` with `bytes`; best effort: a name the file
// system refuses (longer than NAME_MAX) leaves no file, which the reader
// under test then reports.
void WriteWholeFile(const std::string& path, absl::string_view bytes);

// The single-rank load sequence of engine/checkpoint.cc with a
// DefaultLoadPlanner: `metadata` (what `reader` decoded) into `state_dict`.
// The load's errors are its own to report; only crashes and sanitizer
// reports are findings.
absl::Status LoadOneRank(StorageReader& reader, const Metadata& metadata,
                         StateDict& state_dict);

}  // namespace dcp::fuzz

#endif  // DCP_FUZZ_SCRATCH_H_
