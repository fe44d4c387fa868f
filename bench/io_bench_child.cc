// `dcp bench io`'s dcp configurations and its child process (--child
// PHASE): one save or load of the synthetic state in one configuration,
// timed, with its CPU time and page faults, a load checked byte for byte.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/bench_env.h"
#include "bench/io_bench.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "io/io_engine.h"
#include "tools/machine_info.h"
#include "tools/page_cache.h"
#include "tools/synthetic_state.h"

namespace dcp::io_bench {

using Clock = std::chrono::steady_clock;

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

}  // namespace dcp::io_bench
