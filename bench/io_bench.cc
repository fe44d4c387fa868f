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
// --ceiling measures the software path alone, where no disk limits
// (io_bench_ceiling.cc says how).
//
// The parts: this file (the parent and the command line), io_bench_child.cc
// (the configurations and the child), io_bench_report.cc (a size's summary
// and table), io_bench_ceiling.cc (--ceiling); io_bench.h declares what
// they share.
#include "bench/io_bench.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_env.h"
#include "core/status.h"
#include "io/file_system_storage.h"
#include "io/io_engine.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/machine_info.h"

namespace dcp::io_bench {
namespace {

namespace fs = std::filesystem;

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

}  // namespace

void Log(const std::string& line) {
  std::fprintf(stderr, "dcp bench io: %s\n", line.c_str());
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> ParseSizes(
    const std::vector<std::string>& texts) {
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const std::string& text : texts) {
    DCP_ASSIGN_OR_RETURN(int64_t size, ParseSize(text));
    sizes.push_back({text, size});
  }
  return sizes;
}

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

}  // namespace dcp::io_bench

int main(int argc, char** argv) {
  CLI::App app{
      "dcp bench io: dcp save/load vs fio (buffered and O_DIRECT) and "
      "torch.distributed.checkpoint, on the same directory and sizes"};
  dcp::io_bench::BenchFlags flags;
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
  dcp::io_bench::ChildFlags child;
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
      status = dcp::io_bench::RunChild(child);
    }
  } else if (flags.ceiling) {
    if (dir_opt->count() == 0) flags.dir = "/dev/shm";
    status = dcp::io_bench::RunCeiling(flags);
  } else {
    status = dcp::io_bench::Bench(flags).Run();
  }
  if (!status.ok()) {
    std::fprintf(stderr, "dcp bench io: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
