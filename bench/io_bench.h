// What the files of `dcp bench io` share: the dcp configurations and the
// child process that measures one of them (io_bench_child.cc), the parent
// that runs fio, the children and torch (io_bench.cc) and summarizes and
// prints what they measured (io_bench_report.cc), and --ceiling
// (io_bench_ceiling.cc). See io_bench.cc for what the benchmark does.
#ifndef DCP_BENCH_IO_BENCH_H_
#define DCP_BENCH_IO_BENCH_H_

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "io/io_engine.h"
#include "nlohmann/json.hpp"

namespace dcp::io_bench {

using json = nlohmann::json;

inline constexpr double kMiB = 1024.0 * 1024.0;

// Writes "dcp bench io: `line`" to stderr.
void Log(const std::string& line);

// ---------------------------------------------------------------------------
// The dcp configurations and the child that measures one save or load
// (io_bench_child.cc).

struct DcpConfig {
  std::string name;  // "uring-direct", ...
  IoMode mode;
  bool direct;
};

// The four configurations, {io_uring, POSIX} x {buffered, O_DIRECT}.
const std::vector<DcpConfig>& AllConfigs();

// The configuration named `name`; kInvalidArgument naming the choices.
absl::StatusOr<DcpConfig> FindConfig(const std::string& name);

// Whether `config` is what Save/Load use without options (the demo's).
bool IsDefault(const DcpConfig& config);

struct ChildFlags {
  std::string phase;  // "save", "load" (cold) or "load-warm".
  std::string dir;
  int64_t size = 0;
  uint64_t seed = 1;
  std::string config;
  int queue_depth = 0;               // 0: IoEngineOptions' default.
  int buffered_reads_in_flight = 0;  // 0: IoEngineOptions' default.
  int posix_threads = 0;             // 0: IoEngineOptions' default.
  int64_t max_transfer = 0;          // 0: IoEngineOptions' default.
  int64_t max_buffered_read = 0;     // 0: IoEngineOptions' default.
  int64_t writeback = -1;            // -1: FileSystemWriterOptions' default.
  std::string uncached = "default";  // "on", "off", or the defaults.
};

// `io_bench --child PHASE`: one save or load of the synthetic state in this
// process, printed as one JSON line on stdout. A load checks every byte
// against the generator; the check's error when one differs.
absl::Status RunChild(const ChildFlags& flags);

// ---------------------------------------------------------------------------
// The parent: fio, dcp children, torch (io_bench.cc).

struct BenchFlags {
  std::vector<std::string> sizes = {"1GiB"};
  std::string dir = "/tmp";
  int repeat = 3;
  bool torch = false;
  bool json = false;
  std::string out;
  std::vector<std::string> configs;  // Empty: all.
  uint64_t seed = 1;
  int queue_depth = 0;
  int buffered_reads_in_flight = 0;
  int posix_threads = 0;
  std::string max_transfer = "0";
  std::string max_buffered_read = "0";
  std::string writeback = "default";
  std::string uncached = "default";
  std::string fio = "fio";
  // --ceiling: the software path on a tmpfs directory (RunCeiling).
  bool ceiling = false;
  int storage_threads = 0;  // FileSystemWriter/Reader thread_count; 0: theirs.
};

// (text, bytes) of each --size.
absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> ParseSizes(
    const std::vector<std::string>& texts);

struct FioJob {
  std::string name;
  std::string mode;  // "buffered" or "direct": the dcp configs it matches.
  bool write;
  std::vector<std::string> args;
  // Runs while another process holds the state's size of touched memory,
  // as dcp's save child does (HeldMemory): the kernel's dirty-page limit is
  // a share of the memory not held by processes, so holding the state
  // lowers it.
  bool hold_state = false;
  // Context, not the bar's reference: reported next to the bar as
  // "vs_fio_<context>_*" in the JSON, with `context_note` in the text.
  std::string context;
  std::string context_note;
  // fio arguments of an untimed write that creates the file first.
  std::vector<std::string> prepare;
};

// The disk's reference, per mode: what dcp's save and load are held to.
const std::vector<FioJob>& FioJobs();

// The parent (`dcp bench io` without --ceiling): every --size, repeated as
// io_bench.cc's file comment says. Summarize is in io_bench_report.cc.
class Bench {
 public:
  explicit Bench(BenchFlags flags) : flags_(std::move(flags)) {}

  absl::Status Run();

 private:
  absl::Status RunSize(const std::string& size_text, int64_t size,
                       json& report);
  absl::StatusOr<double> Fio(const FioJob& job, int64_t size, int rep);
  absl::Status Dcp(const DcpConfig& config, int64_t size, int rep,
                   bool keep_checkpoint);
  absl::Status Torch(int64_t size, int rep);
  absl::Status Identity(int64_t size);
  void Record(json row);
  json Summarize(const std::string& size_text, int64_t size);

  BenchFlags flags_;
  std::vector<DcpConfig> configs_;
  std::string work_;  // A fresh directory under --dir, removed at the end.
  std::vector<json> rows_;  // This size's raw measurements.
  std::ofstream out_;
  std::string torch_version_;
};

// Prints a size's summary (Bench::Summarize) as a table.
void PrintTable(std::FILE* out, const json& s);

// `dcp bench io --ceiling` (io_bench_ceiling.cc): dcp's save and load on
// tmpfs against a plain pwritev/preadv of the same bytes.
absl::Status RunCeiling(const BenchFlags& flags);

}  // namespace dcp::io_bench

#endif  // DCP_BENCH_IO_BENCH_H_
