// `dcp bench io`: dcp's save and load against the disk (fio) and against
// PyTorch's torch.distributed.checkpoint, in one run, on one directory, with
// the same sizes:
//
//   dcp bench io --size 1GiB,4GiB --dir /tmp/bench [--repeat 3] [--torch]
//                [--json] [--out FILE] [--configs LIST] [--seed N]
//                [--queue-depth N] [--buffered-reads-in-flight N]
//                [--posix-threads N] [--max-transfer SIZE]
//                [--max-buffered-read SIZE] [--writeback SIZE]
//                [--uncached on|off] [--fio PATH]
//   dcp bench io --ceiling [--size 1GiB] [--dir /dev/shm] [--repeat 3]
//                [--storage-threads N] [--json]
//
// Each repetition, per size, runs in this order:
//   1. buffered: fio sequential write (psync, bs 1M, end fsync), cold read
//      (invalidate=1), and the same write again while another process holds
//      the state's size of memory (context: a saving process holds its
//      state, which lowers the kernel's dirty-page limit), and a cold read
//      of a file written O_DIRECT (context: no freed cache pages to reuse,
//      as after dcp's uncached save); then dcp save
//      (sync_files, direct_io off) and cold load (page cache dropped) on
//      io_uring and on POSIX;
//   2. O_DIRECT: fio write (io_uring, qd 32, end fsync) and read, then dcp
//      save and load with direct_io on io_uring and on POSIX;
//   3. with --torch: bench/torch_compare.py saves and loads the same tensors
//      with torch.distributed.checkpoint (first repetition: it also checks
//      that dcp's checkpoint holds exactly those bytes).
// The two groups alternate which goes first, and the engines within a group
// alternate too, so drift of the disk does not favour one configuration.
//
// Every dcp save and load runs in a child process (this binary with
// --child): the save child generates the synthetic state (tools/
// synthetic_state.h) and saves it; the load child allocates the destination
// state, loads into it and checks every byte against the generator without a
// second copy. Peak RSS is the child's ru_maxrss (wait4), reported against
// the state's size: the input for a save, the preallocated destination for a
// load. Ratios dcp/fio are taken per repetition against the fio job of the
// matching mode in the same repetition, then the median; speeds are GB/s
// (1e9 bytes/s) over the tensor bytes.
//
// Prints a table (to stderr with --json, which prints one JSON object to
// stdout); --out FILE keeps every raw measurement as JSON lines, between a
// first line that describes the machine (CPU, memory, kernel, the file
// system and disk under --dir) and a last line with the report. Each save
// and load also reports the CPU time and page faults of its timed part. The
// exit status is non-zero when a run fails or a load does not verify.
//
// --ceiling measures the software path alone, where no disk limits: on a
// tmpfs directory, in one process, per repetition (alternating which goes
// first) dcp's Save (FileSystemWriter defaults: checksums, sync) and Load
// into a preallocated, touched state, against a plain pwritev of the same
// tensors to one file plus fsync and a plain preadv of it into the same
// destination, both on one thread. Reports GB/s, the ratio dcp/plain per
// repetition (issue 19's bar: 0.8), and CPU seconds (user + system, all
// threads) per GB for each. Every read is checked byte for byte, untimed.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_env.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "io/io_engine.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/machine_info.h"
#include "tools/page_cache.h"
#include "tools/synthetic_state.h"

namespace dcp {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr double kMiB = 1024.0 * 1024.0;
// Issue 4's bars.
constexpr double kFioBar = 0.9;
constexpr double kTorchBar = 2.0;
constexpr int64_t kRssAllowance = int64_t{256} << 20;

void Log(const std::string& line) {
  std::fprintf(stderr, "dcp bench io: %s\n", line.c_str());
}

// ---------------------------------------------------------------------------
// Child processes.

// A child process that holds `bytes` of touched anonymous memory until this
// object is destroyed: the memory situation of a process that holds its
// state while it writes (HeldMemory::Start returns once all of it is
// touched). The child only calls mmap, memset, write and read after fork.
class HeldMemory {
 public:
  static absl::StatusOr<std::unique_ptr<HeldMemory>> Start(int64_t bytes) {
    int ready[2], release[2];
    if (::pipe2(ready, O_CLOEXEC) != 0) return ErrnoError(errno, "pipe2");
    if (::pipe2(release, O_CLOEXEC) != 0) {
      const int error = errno;
      ::close(ready[0]);
      ::close(ready[1]);
      return ErrnoError(error, "pipe2");
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int error = errno;
      for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
      return ErrnoError(error, "fork");
    }
    if (pid == 0) {
      ::close(ready[0]);
      ::close(release[1]);
      void* memory =
          ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (memory == MAP_FAILED) ::_exit(1);
      std::memset(memory, 1, static_cast<size_t>(bytes));
      const char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
      char ignored;
      while (::read(release[0], &ignored, 1) < 0 && errno == EINTR) {
      }
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(release[0]);
    auto held = std::unique_ptr<HeldMemory>(new HeldMemory(pid, release[1]));
    char byte = 0;
    ssize_t n;
    while ((n = ::read(ready[0], &byte, 1)) < 0 && errno == EINTR) {
    }
    ::close(ready[0]);
    if (n != 1) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the process holding ", bytes,
                       " bytes of memory failed to touch them all"));
    }
    return held;
  }

  ~HeldMemory() {
    ::close(release_);  // The child's read returns 0: it exits.
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }

 private:
  HeldMemory(pid_t pid, int release) : pid_(pid), release_(release) {}
  pid_t pid_;
  int release_;
};

// ---------------------------------------------------------------------------
// The dcp configurations and the child that measures one save or load.

struct DcpConfig {
  std::string name;  // "uring-direct", ...
  IoMode mode;
  bool direct;
};

const std::vector<DcpConfig>& AllConfigs() {
  static const auto* configs = new std::vector<DcpConfig>{
      {"uring-buffered", IoMode::kUring, false},
      {"posix-buffered", IoMode::kPosix, false},
      {"uring-direct", IoMode::kUring, true},
      {"posix-direct", IoMode::kPosix, true},
  };
  return *configs;
}

absl::StatusOr<DcpConfig> FindConfig(const std::string& name) {
  for (const DcpConfig& c : AllConfigs()) {
    if (c.name == name) return c;
  }
  std::vector<std::string> names;
  for (const DcpConfig& c : AllConfigs()) names.push_back(c.name);
  return absl::InvalidArgumentError(absl::StrCat("unknown configuration \"",
                                                 name, "\"; choose from ",
                                                 absl::StrJoin(names, ", ")));
}

// Whether `config` is what Save/Load use without options (the demo's).
bool IsDefault(const DcpConfig& config) {
  static const std::string* const default_engine = [] {
    absl::StatusOr<std::unique_ptr<IoEngine>> engine = NewIoEngine({});
    return new std::string(engine.ok() ? (*engine)->name() : "");
  }();
  return config.direct == FileSystemWriterOptions{}.direct_io &&
         config.direct == FileSystemReaderOptions{}.direct_io &&
         *default_engine ==
             (config.mode == IoMode::kUring ? "io_uring" : "posix");
}

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

absl::Status RunChild(const ChildFlags& flags) {
  DCP_ASSIGN_OR_RETURN(DcpConfig config, FindConfig(flags.config));
  const bool save = flags.phase == "save";
  SyntheticStateOptions options;
  options.total_bytes = flags.size;
  options.seed = flags.seed;
  options.fill = save;  // A load fills a zeroed, preallocated state.
  StateDict state = MakeSyntheticState(options);
  const int64_t bytes = StateTensorBytes(state);
  IoEngineOptions engine_options;
  engine_options.mode = config.mode;
  if (flags.queue_depth > 0) engine_options.queue_depth = flags.queue_depth;
  if (flags.buffered_reads_in_flight > 0) {
    engine_options.max_buffered_reads_in_flight =
        flags.buffered_reads_in_flight;
  }
  if (flags.posix_threads > 0) engine_options.threads = flags.posix_threads;
  if (flags.max_transfer > 0) engine_options.max_transfer = flags.max_transfer;
  if (flags.max_buffered_read > 0) {
    engine_options.max_buffered_read = flags.max_buffered_read;
  }
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine,
                       NewIoEngine(engine_options));
  // A cold load reads from the disk; a warm one from the page cache, which
  // measures the software path alone (page cache to tensors).
  if (flags.phase == "load") DropPageCache(flags.dir);
  if (flags.phase == "load-warm") WarmPageCache(flags.dir);
  // Whatever earlier steps left for the disk (dirty pages, the journal
  // commit and discards of removed checkpoints) is done before the clock
  // starts, as before each fio job.
  ::sync();
  const int64_t rss_before = PeakRssSelf();
  double seconds = 0;
  ResourceMeter::Use use;
  absl::Status verified;
  if (save) {
    FileSystemWriterOptions writer_options;
    writer_options.direct_io = config.direct;
    if (flags.writeback >= 0) writer_options.writeback_bytes = flags.writeback;
    if (flags.uncached != "default") {
      writer_options.uncached_writes = flags.uncached == "on";
    }
    writer_options.io_engine = engine.get();
    FileSystemWriter writer(flags.dir, writer_options);
    SaveOptions save_options;
    save_options.storage_writer = &writer;
    const ResourceMeter meter;
    const Clock::time_point start = Clock::now();
    DCP_RETURN_IF_ERROR(Save(state, save_options).status());
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
    use = meter.Elapsed();
  } else {
    FileSystemReaderOptions reader_options;
    reader_options.direct_io = config.direct;
    if (flags.uncached != "default") {
      reader_options.uncached_reads = flags.uncached == "on";
    }
    reader_options.io_engine = engine.get();
    FileSystemReader reader(flags.dir, reader_options);
    LoadOptions load_options;
    load_options.storage_reader = &reader;
    const ResourceMeter meter;
    const Clock::time_point start = Clock::now();
    DCP_RETURN_IF_ERROR(Load(state, load_options));
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
    use = meter.Elapsed();
    options.fill = true;
    verified = VerifySyntheticState(state, options);
  }
  json out = {{"phase", flags.phase},
              {"config", config.name},
              {"engine", std::string(engine->name())},
              {"direct", config.direct},
              {"bytes", bytes},
              {"seconds", seconds},
              {"gbps", bytes / seconds / 1e9},
              {"rss_before_io_bytes", rss_before},
              // The timed part's CPU time and page faults (all threads).
              {"user_seconds", use.user_seconds},
              {"system_seconds", use.system_seconds},
              {"minor_faults", use.minor_faults},
              {"major_faults", use.major_faults},
              {"verified", verified.ok()}};
  if (!verified.ok()) out["problem"] = std::string(verified.message());
  std::printf("%s\n", out.dump().c_str());
  return verified;
}

// ---------------------------------------------------------------------------
// The parent: fio, dcp children, torch.

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
    const std::vector<std::string>& texts) {
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const std::string& text : texts) {
    DCP_ASSIGN_OR_RETURN(int64_t size, ParseSize(text));
    sizes.push_back({text, size});
  }
  return sizes;
}

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
const std::vector<FioJob>& FioJobs() {
  static const auto* jobs = new std::vector<FioJob>{
      {"write_buffered_fsync",
       "buffered",
       true,
       {"--rw=write", "--ioengine=psync", "--end_fsync=1"}},
      {"read_cold",
       "buffered",
       false,
       {"--rw=read", "--ioengine=psync", "--invalidate=1"}},
      {"write_buffered_fsync_held",
       "buffered",
       true,
       {"--rw=write", "--ioengine=psync", "--end_fsync=1"},
       /*hold_state=*/true,
       "state_held",
       "the state's memory held"},
      // fio's read_cold reads into the page-cache pages that its invalidate
      // has just freed (the file's, written buffered a moment before). A
      // file written O_DIRECT leaves none, so its cold read fills pages
      // that have been free a while, as dcp's load after an uncached save
      // does; on this VM such pages cost more to fill (docs/BENCHMARKS.md
      // section 1, "fio's cold read and freed pages").
      {"read_cold_fresh_pages",
       "buffered",
       false,
       {"--rw=read", "--ioengine=psync", "--invalidate=1"},
       /*hold_state=*/false,
       "fresh_pages",
       "the file written O_DIRECT: no freed cache pages to reuse",
       {"--rw=write", "--ioengine=io_uring", "--iodepth=32", "--direct=1",
        "--end_fsync=1"}},
      {"write_direct",
       "direct",
       true,
       {"--rw=write", "--ioengine=io_uring", "--iodepth=32", "--direct=1",
        "--end_fsync=1"}},
      {"read_direct",
       "direct",
       false,
       {"--rw=read", "--ioengine=io_uring", "--iodepth=32", "--direct=1"}},
  };
  return *jobs;
}

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

void Bench::Record(json row) {
  if (out_.is_open()) out_ << row.dump() << "\n" << std::flush;
  rows_.push_back(std::move(row));
}

absl::StatusOr<double> Bench::Fio(const FioJob& job, int64_t size, int rep) {
  std::vector<std::string> argv = {flags_.fio,
                                   absl::StrCat("--name=", job.name),
                                   absl::StrCat("--directory=", work_),
                                   "--filename=fio.dat",
                                   absl::StrCat("--size=", size),
                                   "--bs=1M",
                                   "--output-format=json"};
  // Every write starts on a new file, as every dcp save does.
  if (job.write || !job.prepare.empty()) {
    fs::remove(fs::path(work_) / "fio.dat");
  }
  if (!job.prepare.empty()) {
    std::vector<std::string> prepare = argv;
    prepare.insert(prepare.end(), job.prepare.begin(), job.prepare.end());
    ::sync();
    DCP_RETURN_IF_ERROR(RunJsonProcess(prepare).status());
  }
  argv.insert(argv.end(), job.args.begin(), job.args.end());
  std::unique_ptr<HeldMemory> held;
  if (job.hold_state) {
    DCP_ASSIGN_OR_RETURN(held, HeldMemory::Start(size));
  }
  ::sync();  // As before each dcp measurement.
  DCP_ASSIGN_OR_RETURN(json out, RunJsonProcess(argv));
  held.reset();
  const json& j = out.at("jobs").at(0);
  const double bw = std::max(j.at("write").at("bw_bytes").get<double>(),
                             j.at("read").at("bw_bytes").get<double>());
  Record({{"measurement", "fio"},
          {"job", job.name},
          {"mode", job.mode},
          {"rep", rep},
          {"bytes", size},
          {"gbps", bw / 1e9},
          {"fio_version", out.value("fio version", "")}});
  return bw / 1e9;
}

absl::Status Bench::Dcp(const DcpConfig& config, int64_t size, int rep,
                        bool keep_checkpoint) {
  const std::string dir = absl::StrCat(work_, "/dcp-", config.name);
  std::vector<const char*> phases = {"save", "load"};
  // O_DIRECT reads bypass the page cache: a warm load only means something
  // buffered.
  if (!config.direct) phases.push_back("load-warm");
  for (const char* phase : phases) {
    std::vector<std::string> argv = {
        "/proc/self/exe",
        "--child",
        phase,
        "--dir",
        dir,
        "--size",
        absl::StrCat(size),
        "--seed",
        absl::StrCat(flags_.seed),
        "--config",
        config.name,
        "--queue-depth",
        absl::StrCat(flags_.queue_depth),
        "--buffered-reads-in-flight",
        absl::StrCat(flags_.buffered_reads_in_flight),
        "--posix-threads",
        absl::StrCat(flags_.posix_threads),
        "--max-transfer",
        flags_.max_transfer,
        "--max-buffered-read",
        flags_.max_buffered_read,
        "--writeback",
        flags_.writeback,
        "--uncached",
        flags_.uncached};
    ProcessRun child;
    DCP_ASSIGN_OR_RETURN(json row, RunJsonProcess(argv, &child));
    const int64_t max_rss = child.max_rss;
    row["measurement"] = "dcp";
    row["rep"] = rep;
    row["peak_rss_bytes"] = max_rss;
    // Over the state the process had to hold: the input of a save, the
    // preallocated destination of a load.
    row["rss_over_state_bytes"] = max_rss - row.at("bytes").get<int64_t>();
    row["default"] = IsDefault(config);
    const bool verified = row.value("verified", true);
    Log(absl::StrFormat(
        "  %s %-14s %6.3f GB/s  peak RSS %.0f MiB (%+.0f MiB over the state)%s",
        phase, config.name, row.at("gbps").get<double>(), max_rss / kMiB,
        row.at("rss_over_state_bytes").get<double>() / kMiB,
        verified ? "" : "  NOT VERIFIED"));
    Record(row);
    if (!verified) {
      return absl::DataLossError(
          absl::StrCat("dcp load (", config.name,
                       ") did not verify: ", row.value("problem", "")));
    }
  }
  if (!keep_checkpoint) fs::remove_all(dir);
  return absl::OkStatus();
}

absl::Status Bench::Torch(int64_t size, int rep) {
  DCP_ASSIGN_OR_RETURN(
      json row, RunJsonProcess({BenchFile("torch_env.sh"),
                                BenchFile("torch_compare.py"), "run", "--dir",
                                work_, "--seed", absl::StrCat(flags_.seed),
                                "--size", absl::StrCat(size), "--json"}));
  row["measurement"] = "torch";
  row["rep"] = rep;
  torch_version_ = row.value("torch_version", "");
  // The load's first touches of fresh memory (its read buffers) are where
  // its time goes on a VM whose freed memory the host takes back.
  Log(absl::StrFormat(
      "  torch %s: save %.3f GB/s, load %.3f GB/s (%.0fk minor faults, "
      "%.2f s system time)%s",
      torch_version_, row.at("save_gbps").get<double>(),
      row.at("load_gbps").get<double>(),
      row.value("load_minor_faults", 0.0) / 1000,
      row.value("load_system_seconds", 0.0),
      row.value("verified", false) ? "" : "  NOT VERIFIED"));
  const bool verified = row.value("verified", false);
  Record(row);
  if (!verified) return absl::DataLossError("the torch load did not verify");
  return absl::OkStatus();
}

// Proves that torch gets dcp's tensors: torch_compare.py decodes the
// checkpoint of the default configuration and compares every stored byte
// with its own generation.
absl::Status Bench::Identity(int64_t size) {
  std::string dir;
  for (const DcpConfig& c : configs_) {
    if (IsDefault(c)) dir = absl::StrCat(work_, "/dcp-", c.name);
  }
  if (dir.empty()) return absl::OkStatus();
  DCP_ASSIGN_OR_RETURN(
      json row,
      RunJsonProcess({BenchFile("torch_env.sh"), BenchFile("torch_compare.py"),
                      "check-dcp", "--dir", dir, "--seed",
                      absl::StrCat(flags_.seed), "--size", absl::StrCat(size),
                      "--json"}));
  row["measurement"] = "identity";
  const bool identical = row.value("identical", false);
  Log(absl::StrCat("  dcp's checkpoint ",
                   identical ? "==" : "!=", " the tensors torch gets (",
                   row.value("bytes_compared", int64_t{0}),
                   " bytes compared)"));
  Record(row);
  fs::remove_all(dir);
  if (!identical) {
    return absl::DataLossError("torch_compare.py check-dcp: the data differ: " +
                               row.dump());
  }
  return absl::OkStatus();
}

absl::Status Bench::RunSize(const std::string& size_text, int64_t size,
                            json& report) {
  rows_.clear();
  for (int rep = 1; rep <= flags_.repeat; ++rep) {
    const std::string load = LoadAverage();
    Log(absl::StrCat(size_text, " repetition ", rep, "/", flags_.repeat,
                     " (load average ", load, ", ", NowUtc(), ")"));
    Record({{"measurement", "load_average"}, {"rep", rep}, {"value", load}});
    // Alternate which mode goes first and the engine order within a mode.
    std::vector<std::string> modes = {"buffered", "direct"};
    if (rep % 2 == 0) std::reverse(modes.begin(), modes.end());
    for (const std::string& mode : modes) {
      std::vector<DcpConfig> group;
      for (const DcpConfig& c : configs_) {
        if ((mode == "direct") == c.direct) group.push_back(c);
      }
      if (group.empty()) continue;
      if (rep % 2 == 0) std::reverse(group.begin(), group.end());
      for (const FioJob& job : FioJobs()) {
        if (job.mode != mode) continue;
        DCP_ASSIGN_OR_RETURN(double gbps, Fio(job, size, rep));
        Log(absl::StrFormat("  fio %-22s %6.3f GB/s", job.name, gbps));
      }
      fs::remove(fs::path(work_) / "fio.dat");
      for (const DcpConfig& c : group) {
        const bool keep = flags_.torch && rep == 1 && IsDefault(c);
        DCP_RETURN_IF_ERROR(Dcp(c, size, rep, keep));
      }
    }
    if (flags_.torch) {
      if (rep == 1) DCP_RETURN_IF_ERROR(Identity(size));
      DCP_RETURN_IF_ERROR(Torch(size, rep));
    }
  }
  report["sizes"].push_back(Summarize(size_text, size));
  return absl::OkStatus();
}

json Bench::Summarize(const std::string& size_text, int64_t size) {
  auto rows = [&](const std::string& measurement) {
    std::vector<const json*> out;
    for (const json& r : rows_) {
      if (r.at("measurement") == measurement) out.push_back(&r);
    }
    return out;
  };
  // fio: GB/s per job and repetition.
  std::map<std::string, std::map<int, double>> fio;
  for (const json* r : rows("fio")) {
    fio[r->at("job").get<std::string>()][r->at("rep").get<int>()] =
        r->at("gbps").get<double>();
  }
  json s = {{"size", size_text},
            {"fio_bytes", size},
            {"repetitions", flags_.repeat},
            {"load_averages", json::array()}};
  for (const json* r : rows("load_average")) {
    s["load_averages"].push_back(r->at("value"));
  }
  for (const auto& [job, by_rep] : fio) {
    std::vector<double> all;
    for (const auto& [rep, v] : by_rep) all.push_back(v);
    s["fio"][job] = {{"median_gbps", Median(all)}, {"all_gbps", all}};
  }
  bool all_pass = true;
  json checks = json::array();
  auto check = [&](const std::string& what, double value, double bar,
                   bool at_most = false) {
    const bool pass = at_most ? value <= bar : value >= bar;
    all_pass = all_pass && pass;
    checks.push_back(
        {{"check", what}, {"value", value}, {"bar", bar}, {"pass", pass}});
  };
  // dcp: per configuration and phase.
  std::map<std::string, std::map<int, double>> dcp_default;  // phase -> rep.
  for (const DcpConfig& c : configs_) {
    json config = {{"config", c.name}, {"default", IsDefault(c)}};
    for (const std::string phase : {"save", "load"}) {
      const FioJob* ref = nullptr;
      const FioJob* context = nullptr;
      for (const FioJob& job : FioJobs()) {
        if (job.write == (phase == "save") &&
            job.mode == (c.direct ? "direct" : "buffered")) {
          (job.context.empty() ? ref : context) = &job;
        }
      }
      std::vector<double> gbps, ratios, context_ratios, rss, over;
      std::string engine;
      for (const json* r : rows("dcp")) {
        if (r->at("config") != c.name || r->at("phase") != phase) continue;
        const int rep = r->at("rep").get<int>();
        const double v = r->at("gbps").get<double>();
        gbps.push_back(v);
        ratios.push_back(v / fio[ref->name][rep]);
        if (context != nullptr && fio[context->name].count(rep) > 0) {
          context_ratios.push_back(v / fio[context->name][rep]);
        }
        rss.push_back(r->at("peak_rss_bytes").get<double>());
        over.push_back(r->at("rss_over_state_bytes").get<double>());
        engine = r->at("engine").get<std::string>();
        if (IsDefault(c)) dcp_default[phase][rep] = v;
      }
      if (gbps.empty()) continue;
      const double max_over = *std::max_element(over.begin(), over.end());
      config["engine"] = engine;
      config[phase] = {{"median_gbps", Median(gbps)},
                       {"all_gbps", gbps},
                       {"fio_reference", ref->name},
                       {"vs_fio_median", Median(ratios)},
                       {"vs_fio_all", ratios},
                       {"peak_rss_bytes_median", Median(rss)},
                       {"rss_over_state_bytes_max", max_over}};
      if (!context_ratios.empty()) {
        const std::string& key = context->context;
        config[phase]["fio_" + key + "_reference"] = context->name;
        config[phase]["fio_" + key + "_note"] = context->context_note;
        config[phase]["vs_fio_" + key + "_median"] = Median(context_ratios);
        config[phase]["vs_fio_" + key + "_all"] = context_ratios;
      }
      check(absl::StrCat(c.name, " ", phase, " / fio ", ref->name),
            Median(ratios), kFioBar);
      check(absl::StrCat(c.name, " ", phase, " peak RSS over the state"),
            max_over, static_cast<double>(kRssAllowance), /*at_most=*/true);
    }
    s["dcp"].push_back(config);
  }
  std::vector<const json*> torch = rows("torch");
  if (!torch.empty()) {
    json t = {{"version", torch_version_}};
    for (const std::string phase : {"save", "load"}) {
      std::vector<double> gbps, ratios, rss;
      for (const json* r : torch) {
        const double v = r->at(phase + "_gbps").get<double>();
        gbps.push_back(v);
        rss.push_back(r->at(phase + "_peak_rss_bytes").get<double>());
        auto d = dcp_default[phase].find(r->at("rep").get<int>());
        if (d != dcp_default[phase].end()) ratios.push_back(d->second / v);
      }
      t[phase] = {{"median_gbps", Median(gbps)},
                  {"all_gbps", gbps},
                  {"peak_rss_bytes_median", Median(rss)},
                  {"dcp_default_vs_torch_median", Median(ratios)},
                  {"dcp_default_vs_torch_all", ratios}};
      if (!ratios.empty()) {
        check(absl::StrCat("default ", phase, " / torch"), Median(ratios),
              kTorchBar);
      }
    }
    t["save_rss_before_bytes_median"] = Median([&] {
      std::vector<double> v;
      for (const json* r : torch) {
        v.push_back(r->at("save_rss_before_bytes").get<double>());
      }
      return v;
    }());
    s["torch"] = t;
    for (const json* r : rows("identity")) s["identity"] = *r;
  }
  // Warm loads (page cache hot): the software path alone, no bar.
  std::map<int, double> torch_warm;  // rep -> GB/s.
  for (const json* r : torch) {
    if (r->contains("load_warm_gbps")) {
      torch_warm[r->at("rep").get<int>()] =
          r->at("load_warm_gbps").get<double>();
    }
  }
  json warm = json::array();
  for (const DcpConfig& c : configs_) {
    std::vector<double> gbps, ratios;
    for (const json* r : rows("dcp")) {
      if (r->at("config") != c.name || r->at("phase") != "load-warm") continue;
      gbps.push_back(r->at("gbps").get<double>());
      auto t = torch_warm.find(r->at("rep").get<int>());
      if (t != torch_warm.end()) ratios.push_back(gbps.back() / t->second);
    }
    if (gbps.empty()) continue;
    json w = {
        {"config", c.name}, {"median_gbps", Median(gbps)}, {"all_gbps", gbps}};
    if (!ratios.empty()) {
      w["vs_torch_warm_median"] = Median(ratios);
      w["vs_torch_warm_all"] = ratios;
    }
    warm.push_back(w);
  }
  if (!warm.empty() || !torch_warm.empty()) {
    std::vector<double> all;
    for (const auto& [rep, v] : torch_warm) all.push_back(v);
    s["warm_load"] = {{"dcp", warm}};
    if (!all.empty()) {
      s["warm_load"]["torch"] = {{"median_gbps", Median(all)},
                                 {"all_gbps", all}};
    }
  }
  for (const json* r : rows("dcp")) {
    s["state_bytes"] = r->at("bytes");
    break;
  }
  s["checks"] = checks;
  s["all_checks_pass"] = all_pass;
  return s;
}

void PrintTable(std::FILE* out, const json& s) {
  const double state = s.value("state_bytes", 0.0);
  std::fprintf(
      out,
      "\n%s: %.0f bytes of tensors, median of %d repetitions (load "
      "average at their start: %s)\n",
      s.at("size").get<std::string>().c_str(), state,
      s.at("repetitions").get<int>(),
      absl::StrJoin(s.at("load_averages").get<std::vector<std::string>>(), "; ")
          .c_str());
  std::fprintf(out, "  %-34s %9s   %s\n", "fio (bs 1M)", "GB/s", "all");
  for (const auto& [job, v] : s.at("fio").items()) {
    std::vector<std::string> all;
    for (double x : v.at("all_gbps")) all.push_back(absl::StrFormat("%.3f", x));
    std::fprintf(out, "  %-34s %9.3f   %s\n", job.c_str(),
                 v.at("median_gbps").get<double>(),
                 absl::StrJoin(all, " ").c_str());
  }
  std::fprintf(out, "  %-22s %9s %8s %9s %8s %12s %12s\n", "dcp", "save GB/s",
               "x fio", "load GB/s", "x fio", "save RSS+", "load RSS+");
  for (const json& c : s.at("dcp")) {
    auto field = [&](const char* phase, const char* key) {
      return c.contains(phase) ? c.at(phase).at(key).get<double>() : 0.0;
    };
    std::fprintf(out, "  %-22s %9.3f %8.2f %9.3f %8.2f %8.0f MiB %8.0f MiB\n",
                 (c.at("config").get<std::string>() +
                  (c.at("default").get<bool>() ? " (default)" : ""))
                     .c_str(),
                 field("save", "median_gbps"), field("save", "vs_fio_median"),
                 field("load", "median_gbps"), field("load", "vs_fio_median"),
                 field("save", "rss_over_state_bytes_max") / kMiB,
                 field("load", "rss_over_state_bytes_max") / kMiB);
  }
  std::fprintf(out,
               "  (x fio: per-repetition ratio to fio's job of the same mode, "
               "median; RSS+: the most peak RSS above the state's size)\n");
  for (const json& c : s.at("dcp")) {
    for (const char* phase : {"save", "load"}) {
      for (const FioJob& job : FioJobs()) {
        const std::string key = "vs_fio_" + job.context + "_median";
        if (job.context.empty() || !c.contains(phase) ||
            !c.at(phase).contains(key)) {
          continue;
        }
        std::fprintf(out, "  %s %s / fio %s (%s; no bar): %.2fx\n",
                     c.at("config").get<std::string>().c_str(), phase,
                     job.name.c_str(), job.context_note.c_str(),
                     c.at(phase).at(key).get<double>());
      }
    }
  }
  if (s.contains("torch")) {
    const json& t = s.at("torch");
    std::fprintf(out,
                 "  torch %s: save %.3f GB/s (dcp default %.2fx), load %.3f "
                 "GB/s (dcp default %.2fx); peak RSS save %.0f MiB, load %.0f "
                 "MiB\n",
                 t.at("version").get<std::string>().c_str(),
                 t.at("save").at("median_gbps").get<double>(),
                 t.at("save").at("dcp_default_vs_torch_median").get<double>(),
                 t.at("load").at("median_gbps").get<double>(),
                 t.at("load").at("dcp_default_vs_torch_median").get<double>(),
                 t.at("save").at("peak_rss_bytes_median").get<double>() / kMiB,
                 t.at("load").at("peak_rss_bytes_median").get<double>() / kMiB);
  }
  if (s.contains("warm_load")) {
    const json& w = s.at("warm_load");
    std::vector<std::string> parts;
    if (w.contains("torch")) {
      parts.push_back(absl::StrFormat(
          "torch %.3f GB/s", w.at("torch").at("median_gbps").get<double>()));
    }
    for (const json& c : w.at("dcp")) {
      std::string part =
          absl::StrFormat("dcp %s %.3f GB/s", c.at("config").get<std::string>(),
                          c.at("median_gbps").get<double>());
      if (c.contains("vs_torch_warm_median")) {
        absl::StrAppendFormat(&part, " (%.2fx torch)",
                              c.at("vs_torch_warm_median").get<double>());
      }
      parts.push_back(part);
    }
    std::fprintf(out,
                 "  warm load (page cache hot: the software path alone, no "
                 "bar): %s\n",
                 absl::StrJoin(parts, ", ").c_str());
  }
  for (const json& c : s.at("checks")) {
    const std::string what = c.at("check");
    const bool rss = what.find("RSS") != std::string::npos;
    const double scale = rss ? kMiB : 1;
    std::fprintf(out, "  %s %s: %.2f%s (bar %s %.2f%s)\n",
                 c.at("pass").get<bool>() ? "PASS" : "FAIL", what.c_str(),
                 c.at("value").get<double>() / scale, rss ? " MiB" : "x",
                 rss ? "<=" : ">=", c.at("bar").get<double>() / scale,
                 rss ? " MiB" : "x");
  }
}

absl::Status Bench::Run() {
  if (flags_.configs.empty()) {
    configs_ = AllConfigs();
  } else {
    for (const std::string& name : flags_.configs) {
      DCP_ASSIGN_OR_RETURN(DcpConfig c, FindConfig(name));
      configs_.push_back(c);
    }
  }
  DCP_ASSIGN_OR_RETURN(auto sizes, ParseSizes(flags_.sizes));
  DCP_ASSIGN_OR_RETURN(work_, MakeWorkDir(flags_.dir, "dcp-bench-io."));
  if (!flags_.out.empty()) {
    out_.open(flags_.out);
    if (!out_) return absl::PermissionDeniedError("cannot write " + flags_.out);
  }
  json report = {
      {"started", NowUtc()},
      {"dir", work_},
      {"repeat", flags_.repeat},
      {"seed", flags_.seed},
      {"engine_options",
       {{"queue_depth", flags_.queue_depth > 0 ? flags_.queue_depth
                                               : IoEngineOptions{}.queue_depth},
        {"buffered_reads_in_flight",
         flags_.buffered_reads_in_flight > 0
             ? flags_.buffered_reads_in_flight
             : IoEngineOptions{}.max_buffered_reads_in_flight},
        {"posix_threads", flags_.posix_threads > 0 ? flags_.posix_threads
                                                   : IoEngineOptions{}.threads},
        {"max_transfer", flags_.max_transfer != "0"
                             ? flags_.max_transfer
                             : absl::StrCat(IoEngineOptions{}.max_transfer)},
        {"max_buffered_read", flags_.max_buffered_read != "0"
                                  ? flags_.max_buffered_read
                                  : absl::StrCat("0: max_transfer")},
        {"writeback_bytes",
         flags_.writeback != "default"
             ? flags_.writeback
             : absl::StrCat(FileSystemWriterOptions{}.writeback_bytes)},
        {"uncached_writes", flags_.uncached != "default"
                                ? flags_.uncached == "on"
                                : FileSystemWriterOptions{}.uncached_writes},
        {"uncached_reads", flags_.uncached != "default"
                               ? flags_.uncached == "on"
                               : FileSystemReaderOptions{}.uncached_reads}}},
      {"sizes", json::array()}};
  // Which source tree this binary came from (through its runfiles).
  report.update(SourceCommit());
  report["load_average_start"] = LoadAverage();
  const MachineInfo machine = DescribeMachine(work_);
  report["machine"] = MachineJson(machine);
  Log(absl::StrCat("started ", NowUtc(), " in ", work_, ", load average ",
                   LoadAverage(), ", commit ", report.value("commit", "?")));
  Log(absl::StrCat("machine: ", MachineSummary(machine)));
  Record({{"measurement", "machine"}, {"value", report.at("machine")}});
  absl::Status status;
  for (const auto& [text, size] : sizes) {
    status = RunSize(text, size, report);
    if (!status.ok()) break;
  }
  std::error_code ec;
  fs::remove_all(work_, ec);
  DCP_RETURN_IF_ERROR(status);
  report["finished"] = NowUtc();
  report["load_average_end"] = LoadAverage();
  // The summary goes into --out too, so the file alone holds the run.
  Record({{"measurement", "report"}, {"value", report}});
  // The table goes to stdout, or to stderr when stdout takes the JSON.
  std::FILE* table = flags_.json ? stderr : stdout;
  std::fprintf(table, "dcp bench io, %s - %s, dir %s\n",
               report.at("started").get<std::string>().c_str(),
               report.at("finished").get<std::string>().c_str(),
               flags_.dir.c_str());
  for (const json& s : report.at("sizes")) PrintTable(table, s);
  if (flags_.json) std::printf("%s\n", report.dump().c_str());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// --ceiling: the software path where no disk limits (issue 19).

// Issue 19's bar: dcp's save and load at least this share of the plain path.
constexpr double kCeilingBar = 0.8;

// The tensor memory of `state`, in flattened-name order (a sharded tensor's
// local shards in their order); empty tensors are left out.
absl::StatusOr<std::vector<iovec>> TensorMemory(StateDict& state) {
  DCP_ASSIGN_OR_RETURN(auto leaves, FlattenStateDictInPlace(state));
  std::vector<iovec> memory;
  auto add = [&](const Tensor& t) {
    if (t.nbytes() > 0) memory.push_back({t.data(), t.nbytes()});
  };
  for (const auto& [name, value] : leaves) {
    if (value->is_tensor()) add(value->tensor());
    if (value->is_sharded_tensor()) {
      for (const Shard& shard : value->sharded_tensor().local_shards()) {
        add(shard.tensor);
      }
    }
  }
  return memory;
}

// The plain path: one file written from `memory` (pwritev, then fsync) or
// read into it (preadv), in order, IOV_MAX pieces per call, on this thread.
absl::Status PlainVectorIo(const std::string& path,
                           const std::vector<iovec>& memory, bool write) {
  const int fd = ::open(
      path.c_str(),
      write ? O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDONLY | O_CLOEXEC,
      0644);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("open ", path));
  std::vector<iovec> left = memory;  // Advanced past what is transferred.
  size_t next = 0;
  off_t offset = 0;
  absl::Status status;
  while (next < left.size()) {
    const int count =
        static_cast<int>(std::min<size_t>(IOV_MAX, left.size() - next));
    const ssize_t n = write ? ::pwritev(fd, &left[next], count, offset)
                            : ::preadv(fd, &left[next], count, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = ErrnoError(
          errno, absl::StrFormat("%s %s offset=%d",
                                 write ? "pwritev" : "preadv", path, offset));
      break;
    }
    if (n == 0) {
      status = absl::DataLossError(
          absl::StrCat(path, " ends at ", offset, " bytes, before the state"));
      break;
    }
    offset += n;
    for (size_t done = n; done > 0;) {
      if (done >= left[next].iov_len) {
        done -= left[next].iov_len;
        ++next;
      } else {
        left[next].iov_base = static_cast<char*>(left[next].iov_base) + done;
        left[next].iov_len -= done;
        done = 0;
      }
    }
  }
  if (status.ok() && write && ::fsync(fd) != 0) {
    status = ErrnoError(errno, absl::StrCat("fsync ", path));
  }
  ::close(fd);
  return status;
}

// OK when every tensor byte of `actual` equals `expected`'s (same layout);
// then zeroes `actual`, so the next load into it is checked afresh (its
// pages stay touched).
absl::Status CheckAndZero(const std::vector<iovec>& expected,
                          const std::vector<iovec>& actual,
                          const std::string& what) {
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(expected[i].iov_base, actual[i].iov_base,
                    expected[i].iov_len) != 0) {
      return absl::DataLossError(
          absl::StrCat(what, ": tensor ", i, " differs after the read"));
    }
    std::memset(actual[i].iov_base, 0, actual[i].iov_len);
  }
  return absl::OkStatus();
}

// Times fn() on this thread and records a row of `variant` with its CPU
// time (all threads of this process) per GB moved.
template <typename Fn>
absl::StatusOr<json> TimeCeiling(const std::string& variant, int rep,
                                 int64_t bytes, Fn fn) {
  ::sync();  // Nothing pending elsewhere lands inside the clock.
  const ResourceMeter meter;
  const Clock::time_point start = Clock::now();
  DCP_RETURN_IF_ERROR(fn());
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  const ResourceMeter::Use use = meter.Elapsed();
  const double gb = bytes / 1e9;
  json row = {
      {"measurement", "ceiling"},
      {"variant", variant},
      {"rep", rep},
      {"bytes", bytes},
      {"seconds", seconds},
      {"gbps", gb / seconds},
      {"user_seconds", use.user_seconds},
      {"system_seconds", use.system_seconds},
      {"cpu_seconds_per_gb", (use.user_seconds + use.system_seconds) / gb},
      {"minor_faults", use.minor_faults}};
  Log(absl::StrFormat("  %-11s %6.3f GB/s  %.3f CPU s/GB", variant,
                      row.at("gbps").get<double>(),
                      row.at("cpu_seconds_per_gb").get<double>()));
  return row;
}

// Save and load of the synthetic state of `size` against the plain path,
// `repeat` times, alternating which goes first; returns the size's summary.
absl::StatusOr<json> CeilingSize(const BenchFlags& flags,
                                 const std::string& work,
                                 const std::string& size_text, int64_t size) {
  SyntheticStateOptions options;
  options.total_bytes = size;
  options.seed = flags.seed;
  StateDict source = MakeSyntheticState(options);
  options.fill = false;  // Zero-filled: the destination's pages are touched.
  StateDict dest = MakeSyntheticState(options);
  const int64_t bytes = StateTensorBytes(source);
  DCP_ASSIGN_OR_RETURN(std::vector<iovec> source_memory, TensorMemory(source));
  DCP_ASSIGN_OR_RETURN(std::vector<iovec> dest_memory, TensorMemory(dest));
  const std::string plain_file = absl::StrCat(work, "/plain.bin");
  const std::string dcp_dir = absl::StrCat(work, "/dcp");
  std::vector<json> rows;
  auto plain = [&](int rep) -> absl::Status {
    DCP_ASSIGN_OR_RETURN(json w, TimeCeiling("plain_write", rep, bytes, [&] {
                           return PlainVectorIo(plain_file, source_memory,
                                                /*write=*/true);
                         }));
    DCP_ASSIGN_OR_RETURN(json r, TimeCeiling("plain_readv", rep, bytes, [&] {
                           return PlainVectorIo(plain_file, dest_memory,
                                                /*write=*/false);
                         }));
    rows.push_back(w);
    rows.push_back(r);
    fs::remove(plain_file);
    return CheckAndZero(source_memory, dest_memory, "plain readv");
  };
  auto dcp = [&](int rep) -> absl::Status {
    FileSystemWriterOptions writer_options;
    FileSystemReaderOptions reader_options;
    if (flags.storage_threads > 0) {
      writer_options.thread_count = flags.storage_threads;
      reader_options.thread_count = flags.storage_threads;
    }
    FileSystemWriter writer(dcp_dir, writer_options);
    SaveOptions save_options;
    save_options.storage_writer = &writer;
    DCP_ASSIGN_OR_RETURN(json w, TimeCeiling("dcp_save", rep, bytes, [&] {
                           return Save(source, save_options).status();
                         }));
    FileSystemReader reader(dcp_dir, reader_options);
    LoadOptions load_options;
    load_options.storage_reader = &reader;
    DCP_ASSIGN_OR_RETURN(json r, TimeCeiling("dcp_load", rep, bytes, [&] {
                           return Load(dest, load_options);
                         }));
    rows.push_back(w);
    rows.push_back(r);
    fs::remove_all(dcp_dir);
    return CheckAndZero(source_memory, dest_memory, "dcp load");
  };
  std::vector<std::string> load_averages;
  for (int rep = 1; rep <= flags.repeat; ++rep) {
    load_averages.push_back(LoadAverage());
    Log(absl::StrCat(size_text, " repetition ", rep, "/", flags.repeat,
                     " (load average ", load_averages.back(), ", ", NowUtc(),
                     ")"));
    if (rep % 2 == 1) {
      DCP_RETURN_IF_ERROR(plain(rep));
      DCP_RETURN_IF_ERROR(dcp(rep));
    } else {
      DCP_RETURN_IF_ERROR(dcp(rep));
      DCP_RETURN_IF_ERROR(plain(rep));
    }
  }
  // Per phase: dcp against the plain path, per repetition, then the median.
  json summary = {{"size", size_text},
                  {"state_bytes", bytes},
                  {"tensors", source_memory.size()},
                  {"repetitions", flags.repeat},
                  {"load_averages", load_averages},
                  {"rows", rows}};
  auto variant = [&](const std::string& name) {
    std::map<int, const json*> by_rep;
    for (const json& r : rows) {
      if (r.at("variant") == name) by_rep[r.at("rep").get<int>()] = &r;
    }
    return by_rep;
  };
  auto stats = [](const std::map<int, const json*>& by_rep) {
    std::vector<double> gbps, cpu;
    for (const auto& [rep, r] : by_rep) {
      gbps.push_back(r->at("gbps").get<double>());
      cpu.push_back(r->at("cpu_seconds_per_gb").get<double>());
    }
    return json{{"median_gbps", Median(gbps)},
                {"all_gbps", gbps},
                {"median_cpu_seconds_per_gb", Median(cpu)},
                {"all_cpu_seconds_per_gb", cpu}};
  };
  for (const auto& [phase, dcp_name, plain_name] :
       {std::tuple<std::string, std::string, std::string>{"save", "dcp_save",
                                                          "plain_write"},
        {"load", "dcp_load", "plain_readv"}}) {
    const auto d = variant(dcp_name);
    const auto p = variant(plain_name);
    std::vector<double> ratios;
    int met = 0;
    for (const auto& [rep, r] : d) {
      ratios.push_back(r->at("gbps").get<double>() /
                       p.at(rep)->at("gbps").get<double>());
      if (ratios.back() >= kCeilingBar) ++met;
    }
    summary[phase] = {{"dcp", stats(d)},
                      {"plain", stats(p)},
                      {"plain_variant", plain_name},
                      {"vs_plain_median", Median(ratios)},
                      {"vs_plain_all", ratios},
                      {"bar", kCeilingBar},
                      {"met_in", met},
                      {"pass", 3 * met >= 2 * flags.repeat}};
  }
  return summary;
}

void PrintCeiling(std::FILE* out, const json& s) {
  std::fprintf(
      out,
      "\n%s (%.0f bytes in %d tensors), %d repetitions (load average "
      "at their start: %s)\n",
      s.at("size").get<std::string>().c_str(),
      s.at("state_bytes").get<double>(), s.at("tensors").get<int>(),
      s.at("repetitions").get<int>(),
      absl::StrJoin(s.at("load_averages").get<std::vector<std::string>>(), "; ")
          .c_str());
  std::fprintf(out, "  %-5s %10s %10s %14s %14s %8s   %s\n", "phase",
               "dcp GB/s", "plain GB/s", "dcp CPU s/GB", "plain CPU s/GB",
               "x plain", "met (bar 0.8x)");
  for (const char* phase : {"save", "load"}) {
    const json& p = s.at(phase);
    std::vector<std::string> all;
    for (double r : p.at("vs_plain_all")) {
      all.push_back(absl::StrFormat("%.2f", r));
    }
    std::fprintf(
        out, "  %-5s %10.3f %10.3f %14.3f %14.3f %8.2f   %d of %zu (%s)\n",
        phase, p.at("dcp").at("median_gbps").get<double>(),
        p.at("plain").at("median_gbps").get<double>(),
        p.at("dcp").at("median_cpu_seconds_per_gb").get<double>(),
        p.at("plain").at("median_cpu_seconds_per_gb").get<double>(),
        p.at("vs_plain_median").get<double>(), p.at("met_in").get<int>(),
        all.size(), absl::StrJoin(all, " ").c_str());
  }
  std::fprintf(out,
               "  (plain: one thread, pwritev of the tensors + fsync / preadv "
               "into the preallocated, touched destination; x plain: dcp "
               "GB/s over plain GB/s per repetition, median)\n");
}

// `dcp bench io --ceiling`: see the file comment.
absl::Status RunCeiling(const BenchFlags& flags) {
  DCP_ASSIGN_OR_RETURN(auto sizes, ParseSizes(flags.sizes));
  DCP_ASSIGN_OR_RETURN(const std::string work,
                       MakeWorkDir(flags.dir, "dcp-bench-ceiling."));
  const MachineInfo machine = DescribeMachine(work);
  absl::StatusOr<std::unique_ptr<IoEngine>> engine = NewIoEngine({});
  json report = {
      {"mode", "ceiling"},
      {"started", NowUtc()},
      {"dir", work},
      {"file_system", machine.file_system},
      {"repeat", flags.repeat},
      {"seed", flags.seed},
      {"checksums", true},  // Always on: every block is hashed and checked.
      {"checksum_block_size", FileSystemWriterOptions{}.checksum_block_size},
      {"writer_threads", flags.storage_threads > 0
                             ? flags.storage_threads
                             : FileSystemWriterOptions{}.thread_count},
      {"reader_threads", flags.storage_threads > 0
                             ? flags.storage_threads
                             : FileSystemReaderOptions{}.thread_count},
      {"io_engine", engine.ok() ? std::string((*engine)->name()) : ""},
      {"load_average_start", LoadAverage()},
      {"machine", MachineJson(machine)},
      {"sizes", json::array()}};
  report.update(SourceCommit());
  Log(absl::StrCat("ceiling: started ", NowUtc(), " in ", work, " (",
                   machine.file_system, "), load average ", LoadAverage(),
                   ", commit ", report.value("commit", "?")));
  if (machine.file_system != "tmpfs") {
    Log(absl::StrCat("warning: ", work, " is on ", machine.file_system,
                     ", not tmpfs: the storage is in the measurement"));
  }
  absl::Status status;
  for (const auto& [text, size] : sizes) {
    absl::StatusOr<json> summary = CeilingSize(flags, work, text, size);
    if (!summary.ok()) {
      status = summary.status();
      break;
    }
    report["sizes"].push_back(*std::move(summary));
  }
  std::error_code ec;
  fs::remove_all(work, ec);
  DCP_RETURN_IF_ERROR(status);
  report["finished"] = NowUtc();
  report["load_average_end"] = LoadAverage();
  std::FILE* table = flags.json ? stderr : stdout;
  std::fprintf(table,
               "dcp bench io --ceiling, %s - %s, %s (%s), checksums on, "
               "writer/reader threads %d/%d, engine %s\n",
               report.at("started").get<std::string>().c_str(),
               report.at("finished").get<std::string>().c_str(), work.c_str(),
               machine.file_system.c_str(),
               report.at("writer_threads").get<int>(),
               report.at("reader_threads").get<int>(),
               report.at("io_engine").get<std::string>().c_str());
  for (const json& s : report.at("sizes")) PrintCeiling(table, s);
  if (flags.json) std::printf("%s\n", report.dump().c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) {
  CLI::App app{
      "dcp bench io: dcp save/load vs fio (buffered and O_DIRECT) and "
      "torch.distributed.checkpoint, on the same directory and sizes"};
  dcp::BenchFlags flags;
  app.add_option("--size", flags.sizes,
                 "State sizes, comma-separated (e.g. 1GiB,4GiB)")
      ->delimiter(',');
  CLI::Option* dir_opt = app.add_option(
      "--dir", flags.dir,
      "Directory on the disk to measure (a fresh subdirectory is used and "
      "removed; default /tmp, with --ceiling /dev/shm)");
  app.add_option("--repeat", flags.repeat, "Repetitions per size")
      ->check(CLI::PositiveNumber);
  app.add_flag("--torch", flags.torch,
               "Also run torch.distributed.checkpoint on the same tensors "
               "(creates .venv from PyPI the first time)");
  app.add_flag("--json", flags.json, "Print one JSON object");
  app.add_option("--out", flags.out, "Write every measurement as JSON lines");
  app.add_option("--configs", flags.configs,
                 "dcp configurations (default: all of uring-buffered, "
                 "posix-buffered, uring-direct, posix-direct)")
      ->delimiter(',');
  app.add_option("--seed", flags.seed, "Seed of the synthetic state");
  app.add_option("--queue-depth", flags.queue_depth,
                 "io_uring queue depth (0: the engine default)");
  app.add_option("--buffered-reads-in-flight", flags.buffered_reads_in_flight,
                 "io_uring: most buffered reads in flight per ring (0: the "
                 "engine default)");
  app.add_option("--posix-threads", flags.posix_threads,
                 "POSIX engine threads (0: the engine default)");
  app.add_option("--max-buffered-read", flags.max_buffered_read,
                 "Largest single read of a buffered file, e.g. 1MiB (0: the "
                 "engine default)");
  app.add_option("--writeback", flags.writeback,
                 "Buffered saves: start writeback every SIZE bytes per file, "
                 "e.g. 16MiB (0: off; default: the writer's default)");
  app.add_option("--uncached", flags.uncached,
                 "Buffered saves and loads: leave no page they bring into "
                 "the page cache (RWF_DONTCACHE): on, off, or default (the "
                 "writer's and reader's)")
      ->check(CLI::IsMember({"on", "off", "default"}));
  app.add_option("--max-transfer", flags.max_transfer,
                 "Largest single I/O, e.g. 4MiB (0: the engine default)");
  app.add_option("--fio", flags.fio, "The fio program");
  app.add_flag("--ceiling", flags.ceiling,
               "The software ceiling: dcp save and load on tmpfs against a "
               "plain pwritev/preadv of the same bytes, with CPU seconds per "
               "GB (uses --size, --dir, --repeat, --seed, --json, "
               "--storage-threads)");
  app.add_option("--storage-threads", flags.storage_threads,
                 "--ceiling: FileSystemWriter/Reader thread_count (0: their "
                 "defaults)")
      ->check(CLI::NonNegativeNumber);
  dcp::ChildFlags child;
  CLI::Option* child_opt =
      app.add_option("--child", child.phase, "Internal: measure one phase")
          ->check(CLI::IsMember({"save", "load", "load-warm"}))
          ->group("");
  app.add_option("--config", child.config)->group("");
  CLI11_PARSE(app, argc, argv);

  absl::Status status;
  if (*child_opt) {
    child.dir = flags.dir;
    child.seed = flags.seed;
    child.queue_depth = flags.queue_depth;
    child.buffered_reads_in_flight = flags.buffered_reads_in_flight;
    child.posix_threads = flags.posix_threads;
    child.uncached = flags.uncached;
    absl::StatusOr<int64_t> size = dcp::ParseSize(flags.sizes.at(0));
    absl::StatusOr<int64_t> max_transfer = dcp::ParseSize(flags.max_transfer);
    absl::StatusOr<int64_t> max_buffered_read =
        dcp::ParseSize(flags.max_buffered_read);
    absl::StatusOr<int64_t> writeback = flags.writeback == "default"
                                            ? absl::StatusOr<int64_t>(-1)
                                            : dcp::ParseSize(flags.writeback);
    status = !size.ok()                ? size.status()
             : !max_transfer.ok()      ? max_transfer.status()
             : !max_buffered_read.ok() ? max_buffered_read.status()
                                       : writeback.status();
    if (status.ok()) {
      child.writeback = *writeback;
      child.size = *size;
      child.max_transfer = *max_transfer;
      child.max_buffered_read = *max_buffered_read;
      status = dcp::RunChild(child);
    }
  } else if (flags.ceiling) {
    if (dir_opt->count() == 0) flags.dir = "/dev/shm";
    status = dcp::RunCeiling(flags);
  } else {
    status = dcp::Bench(flags).Run();
  }
  if (!status.ok()) {
    std::fprintf(stderr, "dcp bench io: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
