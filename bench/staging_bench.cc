// staging_bench: device-to-host staging throughput of DefaultStager (and of
// StagingPipeline through a bounded staging pool, the writer's path) against
// the raw peak measured in the same run (one large CopyAsync into pinned
// memory, and into pageable memory for contrast), over sizes and 1-4
// streams; plus, for CPU tensors, the time until staging completes against a
// plain memcpy of the same bytes (stall_vs_memcpy, with a stager reused across
// saves; stall_vs_memcpy_fresh, with a new stager of async_save's default
// options each time, which maps and faults in its staging memory anew).
//
// Without a GPU it runs against the host-memory runtime and says so: the
// numbers then measure host memcpy, not PCIe.
//
//   bazel run -c opt //bench:staging_bench -- --sizes_mib=64,256,1024 --json
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "cuda/device_runtime.h"
#include "engine/async_save.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "nlohmann/json.hpp"
#include "staging/device_staging.h"
#include "staging/host_buffer_pool.h"
#include "staging/stager.h"
#include "staging/staging_pipeline.h"
#include "tools/machine_info.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Gbps(size_t bytes, double seconds) { return bytes / seconds / 1e9; }

// Where temporary checkpoints go: $TMPDIR, else /tmp.
std::string TempBase() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// Median of `reps` timings of fn() after one warm-up call.
template <typename Fn>
absl::StatusOr<double> MedianSeconds(int reps, Fn fn) {
  std::vector<double> times;
  for (int i = 0; i <= reps; ++i) {
    const Clock::time_point start = Clock::now();
    absl::Status s = fn();
    const Clock::time_point end = Clock::now();
    if (!s.ok()) return s;
    if (i > 0) times.push_back(Seconds(start, end));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Median time to staging_completion of AsyncSaves each issued right after
// the previous one's staging completed, while its upload still runs (the
// one before that has finished: at most one upload in flight, as in a loop
// that saves every few steps). The first two saves warm up (the second is
// the first to overlap).
absl::StatusOr<double> OverlappingStall(AsyncCheckpointer& checkpointer,
                                        const StateDict& state,
                                        const AsyncSaveOptions& options,
                                        int reps) {
  std::vector<double> stalls;
  std::vector<Future<Metadata>> uploads;
  for (int r = 0; r < reps + 2; ++r) {
    if (r >= 2 && !uploads[r - 2].Wait().ok()) {
      return uploads[r - 2].Wait().status();
    }
    const Clock::time_point start = Clock::now();
    AsyncSaveResponse response = checkpointer.AsyncSave(state, options);
    absl::Status staged = response.staging_completion.Wait();
    if (!staged.ok()) return staged;
    if (r >= 2) stalls.push_back(Seconds(start, Clock::now()));
    uploads.push_back(response.upload_completion);
  }
  for (const Future<Metadata>& upload : uploads) {
    if (!upload.Wait().ok()) return upload.Wait().status();
  }
  std::sort(stalls.begin(), stalls.end());
  return stalls[stalls.size() / 2];
}

struct Row {
  size_t bytes = 0;
  int streams = 0;
  double stager_gbps = 0;
  double peak_pinned_gbps = 0;
  double peak_pageable_gbps = 0;
  double ratio_to_peak = 0;
  double pipeline_gbps = 0;  // StagingPipeline through a bounded pool.
};

absl::Status Run(DeviceRuntime& runtime, const std::vector<size_t>& sizes_mib,
                 int max_streams, int tensors, int reps, size_t pool_mib,
                 bool json) {
  absl::StatusOr<DeviceProperties> props = runtime.GetDeviceProperties(0);
  if (!props.ok()) return props.status();
  HostBufferPoolOptions pool_options;
  pool_options.total_bytes = pool_mib << 20;
  absl::StatusOr<std::unique_ptr<HostBufferPool>> pool_or =
      HostBufferPool::Create(&runtime, pool_options);
  if (!pool_or.ok()) return pool_or.status();
  HostBufferPool& pool = **pool_or;
  std::vector<Row> rows;
  double stall_vs_memcpy = 0;
  double stall_vs_memcpy_fresh = 0;
  double stall_vs_sync_save = 0;
  // Time to staging_completion / memcpy for AsyncSaves issued while the
  // previous upload runs, with two cached staging buffers and with one.
  double stall_overlapping = 0;
  double stall_overlapping_one_buffer = 0;
  size_t stall_bytes = 0;
  for (size_t mib : sizes_mib) {
    const size_t bytes = mib << 20;
    absl::StatusOr<void*> dev = runtime.AllocateDevice(0, bytes);
    absl::StatusOr<void*> pinned = runtime.AllocatePinned(bytes);
    if (!dev.ok()) return dev.status();
    if (!pinned.ok()) return pinned.status();
    std::unique_ptr<std::byte[]> pageable(new std::byte[bytes]);
    std::memset(pageable.get(), 1, bytes);  // Fault the pages in.
    std::memset(*pinned, 1, bytes);
    {
      std::vector<std::byte> init(std::min<size_t>(bytes, 64 << 20),
                                  std::byte{7});
      for (size_t off = 0; off < bytes; off += init.size()) {
        absl::Status s = runtime.Copy(
            static_cast<std::byte*>(*dev) + off, init.data(),
            std::min(init.size(), bytes - off), CopyKind::kHostToDevice);
        if (!s.ok()) return s;
      }
    }
    absl::StatusOr<OwnedStream> stream = MakeOwnedStream(runtime, 0);
    if (!stream.ok()) return stream.status();
    auto raw_copy = [&](void* dst) {
      return [&, dst]() -> absl::Status {
        absl::Status s = runtime.CopyAsync(
            dst, *dev, bytes, CopyKind::kDeviceToHost, stream->get());
        if (!s.ok()) return s;
        return runtime.SynchronizeStream(stream->get());
      };
    };
    absl::StatusOr<double> t_pinned = MedianSeconds(reps, raw_copy(*pinned));
    absl::StatusOr<double> t_pageable =
        MedianSeconds(reps, raw_copy(pageable.get()));
    if (!t_pinned.ok()) return t_pinned.status();
    if (!t_pageable.ok()) return t_pageable.status();

    // The state: `tensors` equal device tensors covering the block.
    StateDict state;
    const size_t per = bytes / tensors;
    for (int i = 0; i < tensors; ++i) {
      state.emplace(absl::StrFormat("layer%03d.weight", i),
                    Tensor::Wrap(TensorView(
                        static_cast<std::byte*>(*dev) + i * per, DType::kU8,
                        {static_cast<int64_t>(per)}, Device::Cuda(0))));
    }
    for (int streams = 1; streams <= max_streams; ++streams) {
      StagingOptions options;
      options.use_async_staging = false;
      options.use_non_blocking_copy = false;
      options.use_shared_memory = false;
      options.num_streams = streams;
      DefaultStager stager(options, &runtime);
      absl::StatusOr<double> t = MedianSeconds(reps, [&]() -> absl::Status {
        // The staged dict dies at once: the cached buffer is reused, as
        // across saves.
        return stager.Stage(state).Wait().status();
      });
      if (!t.ok()) return t.status();
      // The writer's bounded path: the same tensors through the pool, with a
      // consumer that only drops each piece.
      std::vector<PipelineItem> items;
      for (const auto& [name, value] : state) {
        items.push_back({value.tensor().view(), items.size()});
      }
      StagingPipeline pipeline(&runtime, &pool, {.num_streams = streams});
      absl::StatusOr<double> t_pipe = MedianSeconds(reps, [&]() {
        return pipeline.Run(items,
                            [](StagedPiece) { return absl::OkStatus(); });
      });
      if (!t_pipe.ok()) return t_pipe.status();
      Row row;
      row.pipeline_gbps = Gbps(per * tensors, *t_pipe);
      row.bytes = per * tensors;
      row.streams = streams;
      row.stager_gbps = Gbps(row.bytes, *t);
      row.peak_pinned_gbps = Gbps(bytes, *t_pinned);
      row.peak_pageable_gbps = Gbps(bytes, *t_pageable);
      row.ratio_to_peak = row.stager_gbps / row.peak_pinned_gbps;
      rows.push_back(row);
    }

    // CPU tensors: time until staging completes vs a plain memcpy.
    if (bytes <= (size_t{1} << 30)) {
      StateDict cpu_state;
      for (int i = 0; i < tensors; ++i) {
        cpu_state.emplace(
            absl::StrFormat("cpu%03d", i),
            Tensor::Wrap(TensorView(pageable.get() + i * per, DType::kU8,
                                    {static_cast<int64_t>(per)})));
      }
      DefaultStager stager(StagingOptions(), &runtime);  // Seed defaults.
      absl::StatusOr<double> t_stage = MedianSeconds(
          reps, [&]() { return stager.Stage(cpu_state).Wait().status(); });
      absl::StatusOr<double> t_memcpy = MedianSeconds(reps, [&]() {
        std::memcpy(*pinned, pageable.get(), per * tensors);
        return absl::OkStatus();
      });
      absl::StatusOr<double> t_fresh = MedianSeconds(reps, [&]() {
        DefaultStager fresh(StagingOptions::AsyncSaveDefault(), &runtime);
        return fresh.Stage(cpu_state).Wait().status();
      });
      if (!t_stage.ok()) return t_stage.status();
      if (!t_fresh.ok()) return t_fresh.status();
      // The training loop's stall with AsyncSave (until staging_completion)
      // against a synchronous Save of the same state, both into `dir`.
      std::string dir = absl::StrCat(TempBase(), "/dcp-staging-bench-XXXXXX");
      if (::mkdtemp(dir.data()) == nullptr) {
        return absl::InternalError(absl::StrCat("mkdtemp ", dir));
      }
      SaveOptions save;
      save.checkpoint_id = dir;
      absl::StatusOr<double> t_sync =
          MedianSeconds(reps, [&]() { return Save(cpu_state, save).status(); });
      AsyncCheckpointer checkpointer;
      AsyncSaveOptions async_options;
      async_options.save = save;
      async_options.async_stager = &stager;
      std::vector<double> stalls;
      absl::Status async_status;
      for (int r = 0; r < reps && async_status.ok(); ++r) {
        const auto start = std::chrono::steady_clock::now();
        AsyncSaveResponse response =
            checkpointer.AsyncSave(cpu_state, async_options);
        async_status = response.staging_completion.Wait();
        stalls.push_back(std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start)
                             .count());
        if (async_status.ok()) {
          async_status = response.upload_completion.Wait().status();
        }
      }
      // Saves issued while the previous upload still runs (a save every
      // step): each staging needs a buffer while the last one is busy.
      for (int cached : {2, 1}) {
        if (!async_status.ok()) break;
        StagingOptions overlap_options;
        overlap_options.max_cached_buffers = cached;
        DefaultStager overlap_stager(overlap_options, &runtime);
        async_options.async_stager = &overlap_stager;
        absl::StatusOr<double> stall =
            OverlappingStall(checkpointer, cpu_state, async_options, reps);
        if (!stall.ok()) {
          async_status = stall.status();
          break;
        }
        (cached == 2 ? stall_overlapping : stall_overlapping_one_buffer) =
            *stall;
      }
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      if (!t_sync.ok()) return t_sync.status();
      if (!async_status.ok()) return async_status;
      std::sort(stalls.begin(), stalls.end());
      stall_vs_sync_save = stalls[stalls.size() / 2] / *t_sync;
      stall_vs_memcpy = *t_stage / *t_memcpy;
      stall_vs_memcpy_fresh = *t_fresh / *t_memcpy;
      stall_overlapping /= *t_memcpy;
      stall_overlapping_one_buffer /= *t_memcpy;
      stall_bytes = per * tensors;
    }
    absl::Status freed = runtime.FreeDevice(*dev);
    if (freed.ok()) freed = runtime.FreePinned(*pinned);
    if (!freed.ok()) return freed;
  }

  // Summary: the largest size, best stream count.
  Row best;
  for (const Row& r : rows) {
    if (r.bytes > best.bytes ||
        (r.bytes == best.bytes && r.stager_gbps > best.stager_gbps)) {
      best = r;
    }
  }
  const std::string device =
      absl::StrFormat("%s (%s runtime)", props->name, runtime.name());
  if (json) {
    nlohmann::json out;
    out["device"] = device;
    // The host's CPU and memory set the pageable peak and the stalls.
    out["machine"] = MachineSummary(DescribeMachine(TempBase()));
    out["runtime"] = std::string(runtime.name());
    out["host_emulation"] = runtime.is_host();
    out["stager_gbps"] = best.stager_gbps;
    out["peak_pinned_gbps"] = best.peak_pinned_gbps;
    out["peak_pageable_gbps"] = best.peak_pageable_gbps;
    out["ratio_to_peak"] = best.ratio_to_peak;
    out["best_streams"] = best.streams;
    out["pipeline_gbps"] = best.pipeline_gbps;
    out["pipeline_pool_bytes"] = pool.total_bytes();
    out["stall_vs_memcpy"] = stall_vs_memcpy;
    out["stall_vs_memcpy_fresh"] = stall_vs_memcpy_fresh;
    out["stall_bytes"] = stall_bytes;
    out["stall_vs_sync_save"] = stall_vs_sync_save;
    out["stall_overlapping_vs_memcpy"] = stall_overlapping;
    out["stall_overlapping_vs_memcpy_one_buffer"] =
        stall_overlapping_one_buffer;
    out["tensors"] = tensors;
    nlohmann::json table = nlohmann::json::array();
    for (const Row& r : rows) {
      table.push_back({{"bytes", r.bytes},
                       {"streams", r.streams},
                       {"stager_gbps", r.stager_gbps},
                       {"peak_pinned_gbps", r.peak_pinned_gbps},
                       {"peak_pageable_gbps", r.peak_pageable_gbps},
                       {"ratio_to_peak", r.ratio_to_peak},
                       {"pipeline_gbps", r.pipeline_gbps}});
    }
    out["rows"] = table;
    std::printf("%s\n", out.dump().c_str());
    return absl::OkStatus();
  }
  std::printf("device: %s\n", device.c_str());
  std::printf("machine: %s\n",
              MachineSummary(DescribeMachine(TempBase())).c_str());
  if (runtime.is_host()) {
    std::printf(
        "NOTE: no GPU; this runs against the host-memory runtime, so the "
        "numbers measure host memcpy, not PCIe.\n");
  }
  std::printf("%10s %8s %12s %12s %14s %8s %14s\n", "MiB", "streams",
              "stager GB/s", "pinned GB/s", "pageable GB/s", "ratio",
              "pipeline GB/s");
  for (const Row& r : rows) {
    std::printf("%10zu %8d %12.2f %12.2f %14.2f %8.3f %14.2f\n", r.bytes >> 20,
                r.streams, r.stager_gbps, r.peak_pinned_gbps,
                r.peak_pageable_gbps, r.ratio_to_peak, r.pipeline_gbps);
  }
  std::printf("pipeline: StagingPipeline through a %zu MiB staging pool\n",
              pool.total_bytes() >> 20);
  std::printf(
      "CPU tensors, %zu MiB: time to staging completion / plain memcpy = "
      "%.3f (stager reused), %.3f (new stager per save); AsyncSave stall / "
      "synchronous Save = %.3f\n",
      stall_bytes >> 20, stall_vs_memcpy, stall_vs_memcpy_fresh,
      stall_vs_sync_save);
  std::printf(
      "AsyncSave issued while the previous upload runs: time to staging "
      "completion / memcpy = %.3f (2 cached buffers), %.3f (1)\n",
      stall_overlapping, stall_overlapping_one_buffer);
  return absl::OkStatus();
}

// Bytes of a "VmRSS:"/"VmHWM:" line of /proc/self/status.
size_t ProcStatusBytes(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  size_t kib = 0;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, field, n) == 0) kib = std::strtoull(line + n, 0, 10);
  }
  std::fclose(f);
  return kib << 10;
}

// Resets the process's peak RSS (VmHWM) to its current RSS.
void ResetPeakRss() {
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

struct SaveRun {
  double seconds = 0;
  size_t rss_growth = 0;  // Peak RSS during the save minus RSS before it.
};

// One synchronous Save of `state` into a fresh directory under `base`, with
// its peak RSS growth.
absl::StatusOr<SaveRun> TimedSave(const StateDict& state,
                                  const std::string& base,
                                  FileSystemWriterOptions options) {
  std::string dir = absl::StrCat(base, "/dcp-device-save-XXXXXX");
  if (::mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", dir));
  }
  FileSystemWriter writer(dir, options);
  SaveOptions save;
  save.storage_writer = &writer;
  ResetPeakRss();
  const size_t before = ProcStatusBytes("VmRSS:");
  const Clock::time_point start = Clock::now();
  absl::StatusOr<Metadata> saved = Save(state, save);
  SaveRun run;
  run.seconds = Seconds(start, Clock::now());
  run.rss_growth = ProcStatusBytes("VmHWM:") - before;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!saved.ok()) return saved.status();
  return run;
}

// The writer's device path: a synchronous Save of `mib` MiB of device
// tensors through a `pool_mib` staging pool, against a Save of as many bytes
// of CPU tensors into the same directory in the same run; throughput and
// peak RSS above what the process held before each save.
absl::Status DeviceSave(DeviceRuntime& runtime, size_t mib, size_t pool_mib,
                        int tensors, const std::string& base, bool json) {
  const size_t per = (mib << 20) / tensors;
  const size_t bytes = per * tensors;
  std::vector<std::byte> pattern(std::min<size_t>(per, 64 << 20));
  for (size_t i = 0; i < pattern.size(); ++i) {
    pattern[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  }
  SaveRun device_run, cpu_run;
  DeviceStagingOptions staging_options;
  staging_options.pool_bytes = pool_mib << 20;
  DeviceStaging staging(staging_options, &runtime);
  {
    StateDict state;
    std::vector<void*> blocks;
    for (int i = 0; i < tensors; ++i) {
      DCP_ASSIGN_OR_RETURN(void* block, runtime.AllocateDevice(0, per));
      blocks.push_back(block);
      for (size_t off = 0; off < per; off += pattern.size()) {
        DCP_RETURN_IF_ERROR(runtime.Copy(
            static_cast<std::byte*>(block) + off, pattern.data(),
            std::min(pattern.size(), per - off), CopyKind::kHostToDevice));
      }
      state.emplace(absl::StrFormat("layer%03d.weight", i),
                    Tensor::Wrap(TensorView(block, DType::kU8,
                                            {static_cast<int64_t>(per)},
                                            Device::Cuda(0))));
    }
    FileSystemWriterOptions options;
    options.device_staging = &staging;
    absl::StatusOr<SaveRun> run = TimedSave(state, base, options);
    for (void* block : blocks) runtime.FreeDevice(block).IgnoreError();
    if (!run.ok()) return run.status();
    device_run = *run;
  }
  {
    StateDict state;
    for (int i = 0; i < tensors; ++i) {
      Tensor t = Tensor::Empty(DType::kU8, {static_cast<int64_t>(per)});
      for (size_t off = 0; off < per; off += pattern.size()) {
        std::memcpy(static_cast<std::byte*>(t.data()) + off, pattern.data(),
                    std::min(pattern.size(), per - off));
      }
      state.emplace(absl::StrFormat("layer%03d.weight", i), std::move(t));
    }
    DCP_ASSIGN_OR_RETURN(cpu_run, TimedSave(state, base, {}));
  }
  DCP_ASSIGN_OR_RETURN(HostBufferPool * pool, staging.Pool());
  nlohmann::json out = {
      {"device", std::string(runtime.name())},
      {"host_emulation", runtime.is_host()},
      {"bytes", bytes},
      {"tensors", tensors},
      {"pool_bytes", pool->total_bytes()},
      {"pool_peak_chunks", pool->peak_in_use()},
      {"pool_chunks", pool->num_chunks()},
      {"device_save_gbps", Gbps(bytes, device_run.seconds)},
      {"cpu_save_gbps", Gbps(bytes, cpu_run.seconds)},
      {"device_vs_cpu_save", cpu_run.seconds / device_run.seconds},
      {"device_save_rss_growth_bytes", device_run.rss_growth},
      {"cpu_save_rss_growth_bytes", cpu_run.rss_growth},
  };
  if (json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "device save (%s runtime): %zu MiB in %d tensors through a %zu MiB "
        "pool (peak %d of %d chunks): %.3f GB/s, peak RSS +%zu MiB; CPU "
        "save of the same bytes: %.3f GB/s, peak RSS +%zu MiB\n",
        std::string(runtime.name()).c_str(), bytes >> 20, tensors,
        pool->total_bytes() >> 20, pool->peak_in_use(), pool->num_chunks(),
        Gbps(bytes, device_run.seconds), device_run.rss_growth >> 20,
        Gbps(bytes, cpu_run.seconds), cpu_run.rss_growth >> 20);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) {
  CLI::App app{"dcp staging benchmark: stager D2H throughput vs raw peak"};
  std::vector<size_t> sizes_mib = {64, 256, 1024};
  int max_streams = 4;
  int tensors = 8;
  int reps = 3;
  size_t pool_mib = 256;
  bool json = false;
  std::string mode_name = "auto";
  app.add_option("--sizes_mib", sizes_mib, "state sizes in MiB")
      ->delimiter(',');
  app.add_option("--max_streams", max_streams, "sweep 1..N streams")
      ->check(CLI::Range(1, 16));
  app.add_option("--tensors", tensors, "tensors the state is split into")
      ->check(CLI::Range(1, 100000));
  app.add_option("--reps", reps, "timed repetitions (median)")
      ->check(CLI::Range(1, 100));
  app.add_option("--pool_mib", pool_mib, "staging pool of the pipeline rows")
      ->check(CLI::Range(8, 1 << 20));
  app.add_option("--device", mode_name, "device runtime: auto, cuda, host");
  app.add_flag("--json", json, "print one JSON object");
  size_t device_save_mib = 0;
  app.add_option("--device_save_mib", device_save_mib,
                 "instead: save this many MiB of device tensors through a "
                 "--pool_mib pool and of CPU tensors (throughput, peak RSS)");
  std::string dir = dcp::TempBase();
  app.add_option("--dir", dir, "where --device_save_mib saves");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<dcp::DeviceRuntimeMode> mode =
      dcp::ParseDeviceRuntimeMode(mode_name);
  if (!mode.ok()) {
    std::fprintf(stderr, "staging_bench: %s\n",
                 std::string(mode.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<dcp::DeviceRuntime>> runtime =
      dcp::CreateDeviceRuntime(*mode);
  if (!runtime.ok()) {
    std::fprintf(stderr, "staging_bench: %s\n",
                 runtime.status().ToString().c_str());
    return 1;
  }
  absl::Status s = device_save_mib > 0
                       ? dcp::DeviceSave(**runtime, device_save_mib, pool_mib,
                                         tensors, dir, json)
                       : dcp::Run(**runtime, sizes_mib, max_streams, tensors,
                                  reps, pool_mib, json);
  if (!s.ok()) {
    std::fprintf(stderr, "staging_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
