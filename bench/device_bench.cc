// device_bench: the GPU validation measurements, one part per subcommand,
// each against a reference measured in the same run:
//
//   device_bench stager [--sizes_mib=1024,4096,16384] [--layouts=large,small]
//                       [--streams=1,2,3,4] [--chunks_mib=8,64] [--reps=3]
//                       [--coalesce=on,off]
//       DefaultStager device-to-host GB/s per (size, layout, copy streams,
//       copy chunk size, coalesced small copies: small layout only) against
//       one raw CopyAsync of the whole size into pinned memory (the pinned
//       peak).
//   device_bench async [--mib=4096] [--layout=large] [--reps=3] [--dir=D]
//                      [--load_threads=4] [--load_pool_mib=256]
//                      [--reserve=true]
//       AsyncSave of device tensors with the seed's DefaultStager: the time
//       the training loop is blocked (call until staging_completion) against
//       one raw device-to-host copy of the same bytes into pinned memory, and
//       the total time until upload_completion, and the first save's
//       blocked time after DefaultStager::Reserve; then a Load of that
//       checkpoint into device tensors (checked byte for byte) against the
//       raw pinned host-to-device peak.
//   device_bench shm [--mib=4096] [--threads=1,4,8,16] [--dir=/dev/shm]
//                    [--reps=2] [--layout=large]
//       The software ceiling where storage is fast: Save and Load of CPU
//       tensors with N writer/reader threads against a plain write (N
//       threads, one file each, then fsync) and a plain read of the same
//       bytes, alternating which goes first.
//
// Layouts: `large` is 16 equal tensors; `small` cycles through tensors of
// 4 B (a 0-d fp32 step counter), 4 KiB, 64 KiB, 256 KiB and 1 MiB (mean
// ~266 KiB: ~3,900 tensors per GiB); `tiny` is 4 KiB tensors only.
//
// Every part prints one JSON object per line and flushes it, so a part cut
// short by --budget_s or by the caller's timeout keeps the rows it finished;
// the last line of a part says whether it completed ("done") or stopped
// early ("truncated", with the reason). Without a GPU the parts run against
// the host-memory runtime and say so ("host_emulation": true).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "cuda/device_runtime.h"
#include "engine/async_save.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "io/io_engine.h"
#include "nlohmann/json.hpp"
#include "staging/device_staging.h"
#include "staging/stager.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Gbps(size_t bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Emit(const nlohmann::json& row) {
  std::printf("%s\n", row.dump().c_str());
  std::fflush(stdout);
}

// Times `reps` calls of fn() after one warm-up call; returns the median and
// stores the warm-up's time in *first (when given).
template <typename Fn>
absl::StatusOr<double> MedianSeconds(int reps, Fn fn, double* first = nullptr) {
  std::vector<double> times;
  for (int i = 0; i <= reps; ++i) {
    const Clock::time_point start = Clock::now();
    DCP_RETURN_IF_ERROR(fn());
    const double t = Seconds(start, Clock::now());
    if (i == 0) {
      if (first != nullptr) *first = t;
    } else {
      times.push_back(t);
    }
  }
  return Median(times);
}

// Tensor sizes of a layout covering about `bytes`: see the file comment.
absl::StatusOr<std::vector<size_t>> LayoutSizes(const std::string& layout,
                                                size_t bytes) {
  std::vector<size_t> sizes;
  if (layout == "large") {
    constexpr int kTensors = 16;
    sizes.assign(kTensors, std::max<size_t>(bytes / kTensors, 1));
  } else if (layout == "small") {
    static constexpr size_t kCycle[] = {4, 4 << 10, 64 << 10, 256 << 10,
                                        1 << 20};
    size_t total = 0;
    for (size_t i = 0; total < bytes; ++i) {
      const size_t n = std::min(kCycle[i % 5], bytes - total);
      sizes.push_back(n);
      total += n;
    }
  } else if (layout == "tiny") {
    sizes.assign(std::max<size_t>(bytes / 4096, 1), 4096);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown layout '", layout, "' (large, small or tiny)"));
  }
  return sizes;
}

// Offsets of `sizes` packed into one block, each 256-byte aligned (as a
// caching allocator places tensors); the block's size is the last end.
std::vector<size_t> PackedOffsets(const std::vector<size_t>& sizes,
                                  size_t* block_bytes) {
  std::vector<size_t> offsets;
  size_t off = 0;
  for (size_t n : sizes) {
    offsets.push_back(off);
    off += (n + 255) / 256 * 256;
  }
  *block_bytes = off;
  return offsets;
}

size_t Total(const std::vector<size_t>& sizes) {
  size_t total = 0;
  for (size_t n : sizes) total += n;
  return total;
}

// The byte at `offset` of tensor `index`: a cheap pattern that differs
// between tensors and along each tensor.
std::byte PatternByte(size_t index, size_t offset) {
  return static_cast<std::byte>(((offset * 2654435761u) >> 13) + index * 31);
}

void FillPattern(std::byte* dst, size_t index, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) dst[i] = PatternByte(index, i);
}

// A device block holding the tensors of a layout, filled with the pattern.
struct DeviceState {
  DeviceRuntime* runtime = nullptr;
  void* block = nullptr;
  size_t block_bytes = 0;
  std::vector<size_t> sizes;
  std::vector<size_t> offsets;
  StateDict state;

  ~DeviceState() {
    if (block != nullptr) runtime->FreeDevice(block).IgnoreError();
  }
};

absl::StatusOr<std::unique_ptr<DeviceState>> MakeDeviceState(
    DeviceRuntime& runtime, const std::string& layout, size_t bytes,
    bool fill) {
  auto s = std::make_unique<DeviceState>();
  s->runtime = &runtime;
  DCP_ASSIGN_OR_RETURN(s->sizes, LayoutSizes(layout, bytes));
  s->offsets = PackedOffsets(s->sizes, &s->block_bytes);
  DCP_ASSIGN_OR_RETURN(s->block, runtime.AllocateDevice(0, s->block_bytes));
  std::byte* d = static_cast<std::byte*>(s->block);
  if (fill) {
    std::vector<std::byte> host(s->block_bytes);
    for (size_t i = 0; i < s->sizes.size(); ++i) {
      FillPattern(host.data() + s->offsets[i], i, s->sizes[i]);
    }
    DCP_RETURN_IF_ERROR(
        runtime.Copy(d, host.data(), s->block_bytes, CopyKind::kHostToDevice));
  } else {
    const std::vector<std::byte> zeros(
        std::min<size_t>(s->block_bytes, size_t{64} << 20));
    for (size_t off = 0; off < s->block_bytes; off += zeros.size()) {
      DCP_RETURN_IF_ERROR(runtime.Copy(
          d + off, zeros.data(), std::min(zeros.size(), s->block_bytes - off),
          CopyKind::kHostToDevice));
    }
  }
  for (size_t i = 0; i < s->sizes.size(); ++i) {
    s->state.emplace(
        absl::StrFormat("t%06zu", i),
        Tensor::Wrap(TensorView(d + s->offsets[i], DType::kU8,
                                {static_cast<int64_t>(s->sizes[i])},
                                Device::Cuda(0))));
  }
  return s;
}

// Copies the device state back and compares every tensor with the pattern.
absl::Status CheckDeviceState(DeviceRuntime& runtime, const DeviceState& s) {
  std::vector<std::byte> host(s.block_bytes);
  DCP_RETURN_IF_ERROR(runtime.Copy(host.data(), s.block, s.block_bytes,
                                   CopyKind::kDeviceToHost));
  for (size_t i = 0; i < s.sizes.size(); ++i) {
    for (size_t k = 0; k < s.sizes[i]; ++k) {
      if (host[s.offsets[i] + k] != PatternByte(i, k)) {
        return absl::DataLossError(absl::StrFormat(
            "tensor t%06zu differs at byte %zu after the load", i, k));
      }
    }
  }
  return absl::OkStatus();
}

// A fresh directory under `parent`, removed with everything in it when the
// object dies.
class ScratchDir {
 public:
  static absl::StatusOr<std::unique_ptr<ScratchDir>> Create(
      const std::string& parent, const std::string& prefix) {
    std::string path = absl::StrCat(parent, "/", prefix, "-XXXXXX");
    if (::mkdtemp(path.data()) == nullptr) {
      return ErrnoError(errno, absl::StrCat("mkdtemp ", path));
    }
    return std::unique_ptr<ScratchDir>(new ScratchDir(std::move(path)));
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Raw peaks: one CopyAsync of `bytes` between device and pinned memory.
struct Peaks {
  double d2h_seconds = 0;
  double h2d_seconds = 0;
};

absl::StatusOr<Peaks> MeasurePeaks(DeviceRuntime& runtime, void* device,
                                   size_t bytes, int reps) {
  DCP_ASSIGN_OR_RETURN(void* pinned, runtime.AllocatePinned(bytes));
  std::memset(pinned, 1, bytes);
  absl::StatusOr<OwnedStream> stream = MakeOwnedStream(runtime, 0);
  Peaks peaks;
  absl::Status status = stream.status();
  for (CopyKind kind : {CopyKind::kDeviceToHost, CopyKind::kHostToDevice}) {
    if (!status.ok()) break;
    absl::StatusOr<double> t = MedianSeconds(reps, [&]() -> absl::Status {
      const bool d2h = kind == CopyKind::kDeviceToHost;
      DCP_RETURN_IF_ERROR(runtime.CopyAsync(d2h ? pinned : device,
                                            d2h ? device : pinned, bytes, kind,
                                            stream->get()));
      return runtime.SynchronizeStream(stream->get());
    });
    status = t.status();
    if (t.ok()) {
      (kind == CopyKind::kDeviceToHost ? peaks.d2h_seconds
                                       : peaks.h2d_seconds) = *t;
    }
  }
  stream = absl::CancelledError();  // Destroy the stream before the memory.
  runtime.FreePinned(pinned).IgnoreError();
  DCP_RETURN_IF_ERROR(status);
  return peaks;
}

nlohmann::json Header(DeviceRuntime& runtime, const std::string& part) {
  absl::StatusOr<DeviceProperties> props = runtime.GetDeviceProperties(0);
  return {{"part", part},
          {"device", props.ok() ? props->name : "unknown"},
          {"runtime", std::string(runtime.name())},
          {"host_emulation", runtime.is_host()}};
}

// Budget: parts stop starting new rows once it is spent.
struct Budget {
  Clock::time_point start = Clock::now();
  double seconds = 0;  // 0: none.
  bool Spent() const {
    return seconds > 0 && Seconds(start, Clock::now()) > seconds;
  }
};

void EmitEnd(const std::string& part, const Budget& budget, bool truncated) {
  nlohmann::json end = {{"part", part},
                        {"elapsed_s", Seconds(budget.start, Clock::now())}};
  if (truncated) {
    end["truncated"] = true;
    end["reason"] = absl::StrFormat("budget of %.0f s spent", budget.seconds);
  } else {
    end["done"] = true;
  }
  Emit(end);
}

struct StagerFlags {
  std::vector<size_t> sizes_mib = {1024, 4096, 16384};
  std::vector<std::string> layouts = {"large", "small"};
  std::vector<int> streams = {1, 2, 3, 4};
  std::vector<size_t> chunks_mib = {8, 64};
  // StagingOptions::coalesce_device_copies, swept for the small layout
  // only (large tensors are never coalesced).
  std::vector<std::string> coalesce = {"on", "off"};
  int reps = 3;
};

absl::Status RunStager(DeviceRuntime& runtime, const StagerFlags& flags,
                       const Budget& budget) {
  Emit(Header(runtime, "stager"));
  for (size_t mib : flags.sizes_mib) {
    for (const std::string& layout : flags.layouts) {
      if (budget.Spent()) {
        EmitEnd("stager", budget, true);
        return absl::OkStatus();
      }
      DCP_ASSIGN_OR_RETURN(
          std::unique_ptr<DeviceState> s,
          MakeDeviceState(runtime, layout, mib << 20, /*fill=*/false));
      const size_t bytes = Total(s->sizes);
      DCP_ASSIGN_OR_RETURN(
          Peaks peaks,
          MeasurePeaks(runtime, s->block, s->block_bytes, flags.reps));
      Emit({{"part", "stager_peak"},
            {"bytes", s->block_bytes},
            {"layout", layout},
            {"d2h_pinned_gbps", Gbps(s->block_bytes, peaks.d2h_seconds)},
            {"h2d_pinned_gbps", Gbps(s->block_bytes, peaks.h2d_seconds)}});
      for (const std::string& coalesce : flags.coalesce) {
        if (layout == "large" && coalesce != flags.coalesce.front()) continue;
        for (size_t chunk_mib : flags.chunks_mib) {
          for (int streams : flags.streams) {
            if (budget.Spent()) {
              EmitEnd("stager", budget, true);
              return absl::OkStatus();
            }
            StagingOptions options;
            options.coalesce_device_copies = coalesce == "on";
            options.use_async_staging = false;
            options.use_non_blocking_copy = false;
            options.use_shared_memory = false;
            options.num_streams = streams;
            options.copy_chunk_bytes = chunk_mib << 20;
            DefaultStager stager(options, &runtime);
            double first = 0;
            DCP_ASSIGN_OR_RETURN(
                double t,
                MedianSeconds(
                    flags.reps,
                    [&]() { return stager.Stage(s->state).Wait().status(); },
                    &first));
            // The peak moves the padded block; the stager the tensor bytes.
            const double peak = Gbps(s->block_bytes, peaks.d2h_seconds);
            Emit({{"part", "stager"},
                  {"bytes", bytes},
                  {"layout", layout},
                  {"tensors", s->sizes.size()},
                  {"streams", streams},
                  {"chunk_bytes", chunk_mib << 20},
                  {"stager_gbps", Gbps(bytes, t)},
                  {"peak_d2h_gbps", peak},
                  {"ratio_to_peak", peak > 0 ? Gbps(bytes, t) / peak : 0},
                  {"first_stage_s", first},
                  {"coalesce", coalesce},
                  {"us_per_tensor", t / s->sizes.size() * 1e6}});
          }
        }
      }
    }
  }
  EmitEnd("stager", budget, false);
  return absl::OkStatus();
}

struct AsyncFlags {
  size_t mib = 4096;
  std::string layout = "large";
  int reps = 3;
  std::string dir = "/tmp";
  int load_threads = 4;
  size_t load_pool_mib = 256;
  // DefaultStager::Reserve before the first save.
  bool reserve = true;
};

absl::Status RunAsync(DeviceRuntime& runtime, const AsyncFlags& flags,
                      const Budget& budget) {
  Emit(Header(runtime, "async"));
  DCP_ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceState> s,
      MakeDeviceState(runtime, flags.layout, flags.mib << 20, /*fill=*/true));
  const size_t bytes = Total(s->sizes);
  DCP_ASSIGN_OR_RETURN(Peaks peaks,
                       MeasurePeaks(runtime, s->block, bytes, flags.reps));
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<ScratchDir> scratch,
                       ScratchDir::Create(flags.dir, "dcp-device-bench"));
  const std::string& base = scratch->path();

  // Saves: the seed's DefaultStager (pinned, shared memory, async staging,
  // non-blocking copies), kept across saves as a training loop keeps it.
  DefaultStager stager(StagingOptions(), &runtime);
  double reserve_s = 0;
  if (flags.reserve) {  // As a loop does when it starts.
    const Clock::time_point t0 = Clock::now();
    DCP_RETURN_IF_ERROR(stager.Reserve(s->state).Wait());
    reserve_s = Seconds(t0, Clock::now());
  }
  AsyncCheckpointer checkpointer;
  std::vector<double> returned, blocked, total;
  double first_blocked = 0;
  std::string last_dir;
  bool truncated = false;
  for (int r = 0; r <= flags.reps; ++r) {
    if (r > 1 && budget.Spent()) {
      truncated = true;
      break;
    }
    const std::string dir = absl::StrCat(base, "/save-", r);
    AsyncSaveOptions options;
    options.save.checkpoint_id = dir;
    options.async_stager = &stager;
    const Clock::time_point t0 = Clock::now();
    AsyncSaveResponse response = checkpointer.AsyncSave(s->state, options);
    const Clock::time_point t1 = Clock::now();
    DCP_RETURN_IF_ERROR(response.staging_completion.Wait());
    const Clock::time_point t2 = Clock::now();
    DCP_RETURN_IF_ERROR(response.upload_completion.Wait().status());
    const Clock::time_point t3 = Clock::now();
    Emit({{"part", "async_save"},
          {"rep", r},
          {"warmup", r == 0},
          {"bytes", bytes},
          {"return_s", Seconds(t0, t1)},
          {"blocked_s", Seconds(t0, t2)},
          {"total_s", Seconds(t0, t3)}});
    if (r == 0) first_blocked = Seconds(t0, t2);
    if (r > 0) {
      returned.push_back(Seconds(t0, t1));
      blocked.push_back(Seconds(t0, t2));
      total.push_back(Seconds(t0, t3));
    }
    if (!last_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(last_dir, ec);
    }
    last_dir = dir;
  }
  const double d2h = peaks.d2h_seconds;
  Emit({{"part", "async_save_summary"},
        {"bytes", bytes},
        {"layout", flags.layout},
        {"tensors", s->sizes.size()},
        {"dir", flags.dir},
        {"raw_d2h_s", d2h},
        {"raw_d2h_gbps", Gbps(bytes, d2h)},
        {"return_s", Median(returned)},
        {"blocked_s", Median(blocked)},
        {"blocked_vs_raw_d2h", d2h > 0 ? Median(blocked) / d2h : 0},
        {"total_s", Median(total)},
        {"total_gbps", Gbps(bytes, Median(total))},
        {"saves", blocked.size()},
        {"reserve", flags.reserve},
        {"reserve_s", reserve_s},
        {"first_blocked_s", first_blocked}});

  // Loads of the last checkpoint into zeroed device tensors.
  DCP_ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceState> dest,
      MakeDeviceState(runtime, flags.layout, flags.mib << 20, /*fill=*/false));
  DeviceStagingOptions staging_options;
  staging_options.pool_bytes = flags.load_pool_mib << 20;
  DeviceStaging load_staging(staging_options, &runtime);
  std::vector<double> loads;
  for (int r = 0; r <= flags.reps && !last_dir.empty(); ++r) {
    if (r > 1 && budget.Spent()) {
      truncated = true;
      break;
    }
    FileSystemReaderOptions reader_options;
    reader_options.thread_count = flags.load_threads;
    reader_options.device_staging = &load_staging;
    FileSystemReader reader(last_dir, reader_options);
    LoadOptions load;
    load.storage_reader = &reader;
    const Clock::time_point t0 = Clock::now();
    DCP_RETURN_IF_ERROR(Load(dest->state, load));
    const double t = Seconds(t0, Clock::now());
    bool checked = false;
    if (r == 0) {
      DCP_RETURN_IF_ERROR(CheckDeviceState(runtime, *dest));
      checked = true;
    }
    Emit({{"part", "device_load"},
          {"rep", r},
          {"warmup", r == 0},
          {"seconds", t},
          {"gbps", Gbps(bytes, t)},
          {"checked_equal", checked}});
    if (r > 0) loads.push_back(t);
  }
  const double h2d = peaks.h2d_seconds;
  Emit({{"part", "device_load_summary"},
        {"bytes", bytes},
        {"dir", flags.dir},
        {"load_threads", flags.load_threads},
        {"pool_bytes", flags.load_pool_mib << 20},
        {"raw_h2d_gbps", Gbps(bytes, h2d)},
        {"load_gbps", Gbps(bytes, Median(loads))},
        {"load_vs_raw_h2d", Median(loads) > 0 ? h2d / Median(loads) : 0},
        {"loads", loads.size()}});
  EmitEnd("async", budget, truncated);
  return absl::OkStatus();
}

struct ShmFlags {
  size_t mib = 4096;
  std::vector<int> threads = {1, 4, 8, 16};
  std::string dir = "/dev/shm";
  int reps = 2;
  std::string layout = "large";
  std::string io_mode = "auto";
};

// Runs fn(i) for i in [0, n) on n threads; the first error wins.
template <typename Fn>
absl::Status OnThreads(int n, Fn fn) {
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] { results[i] = fn(i); });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) DCP_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// The reference: `n` threads each write (then fsync) or read one file of
// bytes/n, from or into `memory`, in 64 MiB calls.
absl::Status PlainIo(const std::string& dir, std::byte* memory, size_t bytes,
                     int n, bool write) {
  const size_t per = (bytes + n - 1) / n;
  return OnThreads(n, [&](int i) -> absl::Status {
    const size_t begin = std::min(bytes, i * per);
    const size_t end = std::min(bytes, begin + per);
    const std::string path = absl::StrCat(dir, "/plain-", i);
    const int fd = ::open(
        path.c_str(), write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0644);
    if (fd < 0) return ErrnoError(errno, absl::StrCat("open ", path));
    for (size_t off = begin; off < end;) {
      const size_t len = std::min<size_t>(end - off, size_t{64} << 20);
      const ssize_t got = write ? ::pwrite(fd, memory + off, len, off - begin)
                                : ::pread(fd, memory + off, len, off - begin);
      if (got <= 0) {
        const int err = got < 0 ? errno : EIO;
        ::close(fd);
        return ErrnoError(err,
                          absl::StrCat(write ? "pwrite " : "pread ", path));
      }
      off += got;
    }
    if (write && ::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(err, absl::StrCat("fsync ", path));
    }
    ::close(fd);
    return absl::OkStatus();
  });
}

absl::Status RunShm(const ShmFlags& flags, const Budget& budget) {
  DCP_ASSIGN_OR_RETURN(IoMode io_mode, ParseIoMode(flags.io_mode));
  Emit({{"part", "shm"},
        {"dir", flags.dir},
        {"layout", flags.layout},
        {"io_mode", flags.io_mode}});
  DCP_ASSIGN_OR_RETURN(std::vector<size_t> sizes,
                       LayoutSizes(flags.layout, flags.mib << 20));
  const size_t bytes = Total(sizes);
  StateDict state, dest;
  std::vector<std::byte*> sources;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string key = absl::StrFormat("t%06zu", i);
    Tensor t = Tensor::Empty(DType::kU8, {static_cast<int64_t>(sizes[i])});
    FillPattern(static_cast<std::byte*>(t.data()), i, sizes[i]);
    sources.push_back(static_cast<std::byte*>(t.data()));
    state.emplace(key, std::move(t));
    Tensor d = Tensor::Empty(DType::kU8, {static_cast<int64_t>(sizes[i])});
    std::memset(d.data(), 0, sizes[i]);
    dest.emplace(key, std::move(d));
  }
  // The plain reference moves the same bytes from one contiguous buffer.
  std::vector<std::byte> plain(bytes);
  for (size_t i = 0, off = 0; i < sizes.size(); off += sizes[i], ++i) {
    std::memcpy(plain.data() + off, sources[i], sizes[i]);
  }
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<ScratchDir> scratch,
                       ScratchDir::Create(flags.dir, "dcp-shm-bench"));
  const std::string& base = scratch->path();
  for (int threads : flags.threads) {
    if (budget.Spent()) {
      EmitEnd("shm", budget, true);
      return absl::OkStatus();
    }
    std::vector<double> pw, pr, ds, dl;
    bool checked = false;
    for (int r = 0; r < flags.reps; ++r) {
      const std::string plain_dir = absl::StrCat(base, "/plain");
      const std::string dcp_dir = absl::StrCat(base, "/dcp");
      auto run_plain = [&]() -> absl::Status {
        std::filesystem::create_directories(plain_dir);
        Clock::time_point t0 = Clock::now();
        DCP_RETURN_IF_ERROR(PlainIo(plain_dir, plain.data(), bytes, threads,
                                    /*write=*/true));
        pw.push_back(Seconds(t0, Clock::now()));
        t0 = Clock::now();
        DCP_RETURN_IF_ERROR(PlainIo(plain_dir, plain.data(), bytes, threads,
                                    /*write=*/false));
        pr.push_back(Seconds(t0, Clock::now()));
        std::error_code ec;
        std::filesystem::remove_all(plain_dir, ec);
        return absl::OkStatus();
      };
      auto run_dcp = [&]() -> absl::Status {
        FileSystemWriterOptions writer_options;
        writer_options.thread_count = threads;
        writer_options.io_mode = io_mode;
        FileSystemWriter writer(dcp_dir, writer_options);
        SaveOptions save;
        save.storage_writer = &writer;
        Clock::time_point t0 = Clock::now();
        DCP_RETURN_IF_ERROR(Save(state, save).status());
        ds.push_back(Seconds(t0, Clock::now()));
        FileSystemReaderOptions reader_options;
        reader_options.thread_count = threads;
        reader_options.io_mode = io_mode;
        FileSystemReader reader(dcp_dir, reader_options);
        LoadOptions load;
        load.storage_reader = &reader;
        t0 = Clock::now();
        DCP_RETURN_IF_ERROR(Load(dest, load));
        dl.push_back(Seconds(t0, Clock::now()));
        if (!checked) {
          for (size_t i = 0; i < sizes.size(); ++i) {
            const std::string key = absl::StrFormat("t%06zu", i);
            if (std::memcmp(dest.at(key).tensor().data(), sources[i],
                            sizes[i]) != 0) {
              return absl::DataLossError(
                  absl::StrCat("tensor ", key, " differs after the load"));
            }
            std::memset(dest.at(key).tensor().data(), 0, sizes[i]);
          }
          checked = true;
        }
        std::error_code ec;
        std::filesystem::remove_all(dcp_dir, ec);
        return absl::OkStatus();
      };
      if (r % 2 == 0) {
        DCP_RETURN_IF_ERROR(run_plain());
        DCP_RETURN_IF_ERROR(run_dcp());
      } else {
        DCP_RETURN_IF_ERROR(run_dcp());
        DCP_RETURN_IF_ERROR(run_plain());
      }
    }
    const double w = Gbps(bytes, Median(pw)), r = Gbps(bytes, Median(pr));
    const double s = Gbps(bytes, Median(ds)), l = Gbps(bytes, Median(dl));
    Emit({{"part", "shm"},
          {"threads", threads},
          {"bytes", bytes},
          {"tensors", sizes.size()},
          {"plain_write_gbps", w},
          {"dcp_save_gbps", s},
          {"save_vs_plain", w > 0 ? s / w : 0},
          {"plain_read_gbps", r},
          {"dcp_load_gbps", l},
          {"load_vs_plain", r > 0 ? l / r : 0},
          {"checked_equal", checked},
          {"reps", flags.reps}});
  }
  EmitEnd("shm", budget, false);
  return absl::OkStatus();
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) {
  CLI::App app{
      "dcp device benchmarks: staging, AsyncSave from the device, "
      "loads into the device, the software ceiling on fast storage"};
  app.require_subcommand(1);
  std::string mode_name = "auto";
  double budget_s = 0;
  app.add_option("--device", mode_name, "device runtime: auto, cuda, host");
  app.add_option("--budget_s", budget_s,
                 "stop starting new rows after this many seconds (0: none)");

  dcp::StagerFlags stager;
  CLI::App* stager_cmd = app.add_subcommand("stager", "stager D2H sweep");
  stager_cmd->add_option("--sizes_mib", stager.sizes_mib)->delimiter(',');
  stager_cmd->add_option("--layouts", stager.layouts)->delimiter(',');
  stager_cmd->add_option("--streams", stager.streams)
      ->delimiter(',')
      ->check(CLI::Range(1, 16));
  stager_cmd->add_option("--chunks_mib", stager.chunks_mib)
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  stager_cmd->add_option("--reps", stager.reps)->check(CLI::Range(1, 100));
  stager_cmd->add_option("--coalesce", stager.coalesce)
      ->delimiter(',')
      ->check(CLI::IsMember({"on", "off"}));

  dcp::AsyncFlags async;
  CLI::App* async_cmd =
      app.add_subcommand("async", "AsyncSave from and Load into the device");
  async_cmd->add_option("--mib", async.mib)->check(CLI::Range(1, 1 << 22));
  async_cmd->add_option("--layout", async.layout);
  async_cmd->add_option("--reps", async.reps)->check(CLI::Range(1, 100));
  async_cmd->add_option("--dir", async.dir);
  async_cmd->add_option("--load_threads", async.load_threads)
      ->check(CLI::Range(1, 64));
  async_cmd->add_option("--load_pool_mib", async.load_pool_mib)
      ->check(CLI::Range(16, 1 << 16));
  async_cmd->add_option("--reserve", async.reserve,
                        "reserve the staging memory before the first save");

  dcp::ShmFlags shm;
  CLI::App* shm_cmd =
      app.add_subcommand("shm", "save/load vs plain I/O on fast storage");
  shm_cmd->add_option("--mib", shm.mib)->check(CLI::Range(1, 1 << 22));
  shm_cmd->add_option("--threads", shm.threads)
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  shm_cmd->add_option("--dir", shm.dir);
  shm_cmd->add_option("--reps", shm.reps)->check(CLI::Range(1, 100));
  shm_cmd->add_option("--layout", shm.layout);
  shm_cmd->add_option("--io_mode", shm.io_mode, "auto, uring or posix");
  CLI11_PARSE(app, argc, argv);

  dcp::Budget budget;
  budget.seconds = budget_s;
  absl::Status s;
  if (shm_cmd->parsed()) {
    s = dcp::RunShm(shm, budget);
  } else {
    absl::StatusOr<dcp::DeviceRuntimeMode> mode =
        dcp::ParseDeviceRuntimeMode(mode_name);
    absl::StatusOr<std::unique_ptr<dcp::DeviceRuntime>> runtime =
        mode.ok() ? dcp::CreateDeviceRuntime(*mode)
                  : absl::StatusOr<std::unique_ptr<dcp::DeviceRuntime>>(
                        mode.status());
    if (!runtime.ok()) {
      s = runtime.status();
    } else if (stager_cmd->parsed()) {
      s = dcp::RunStager(**runtime, stager, budget);
    } else {
      s = dcp::RunAsync(**runtime, async, budget);
    }
  }
  if (!s.ok()) {
    dcp::Emit({{"error", s.ToString()}});
    std::fprintf(stderr, "device_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
