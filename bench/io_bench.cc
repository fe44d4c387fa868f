// Saves and loads N bytes of CPU tensors through FileSystemWriter/Reader and
// reports throughput, for side-by-side comparison with fio on the same
// directory (bench/fio_compare.sh).
//
//   bazel run -c opt //bench:io_bench -- --dir=/path --size_mb=1024 \
//       --tensor_mb=16 --mode=uring|posix|auto --direct=0|1 --threads=1 \
//       --cold=1
//
// Prints one JSON object: bytes, save_seconds, load_seconds, save_gbps,
// load_gbps (GB = 1e9 bytes), engine, direct, peak RSS (MiB) once the source
// and destination tensors exist, after the save and after the load, and
// verified.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/io_engine.h"
#include "io/testing/fake_planners.h"

namespace {

using namespace dcp;

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Evicts the directory's files from the page cache (clean pages only: the
// save fsynced them), so the load reads from the device like fio's
// invalidate=1.
void DropCache(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names =
      LocalFileSystem().ListDir(dir);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    const std::string path = JoinPath(dir, name);
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Peak resident set size so far, in MiB.
double PeakRssMib() {
  struct rusage usage;
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "io_bench: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/dcp_io_bench";
  int64_t size_mb = 1024, tensor_mb = 16;
  std::string mode_name = "auto";
  bool direct = true, cold = true;  // The writer and reader defaults.
  int threads = 1;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    auto value = [&](absl::string_view flag) -> const char* {
      return absl::StartsWith(arg, flag) ? argv[i] + flag.size() : nullptr;
    };
    if (const char* v = value("--dir=")) dir = v;
    if (const char* v = value("--size_mb=")) size_mb = std::atoll(v);
    if (const char* v = value("--tensor_mb=")) tensor_mb = std::atoll(v);
    if (const char* v = value("--mode=")) mode_name = v;
    if (const char* v = value("--direct=")) direct = std::atoi(v) != 0;
    if (const char* v = value("--threads=")) threads = std::atoi(v);
    if (const char* v = value("--cold=")) cold = std::atoi(v) != 0;
  }
  absl::StatusOr<IoMode> mode = ParseIoMode(mode_name);
  if (!mode.ok()) return Fail(mode.status());
  IoEngineOptions engine_options;
  engine_options.mode = *mode;
  absl::StatusOr<std::unique_ptr<IoEngine>> engine =
      NewIoEngine(engine_options);
  if (!engine.ok()) return Fail(engine.status());

  // The state: size_mb / tensor_mb float32 tensors with a fixed pattern.
  const int64_t count = std::max<int64_t>(1, size_mb / tensor_mb);
  const int64_t elements = tensor_mb * (1 << 20) / 4;
  testing::FakeSavePlanner save_planner;
  testing::FakeLoadPlanner load_planner;
  std::vector<Tensor> sources, destinations;
  for (int64_t t = 0; t < count; ++t) {
    Tensor tensor = Tensor::Empty(DType::kF32, {elements});
    auto* words = static_cast<uint32_t*>(tensor.data());
    for (int64_t e = 0; e < elements; ++e) {
      words[e] = static_cast<uint32_t>(e * 2654435761u + t);
    }
    const std::string name = absl::StrCat("layer.", t, ".weight");
    save_planner.AddTensor(name, tensor);
    destinations.push_back(Tensor::Empty(DType::kF32, {elements}));
    load_planner.SetDestination(MetadataIndex(name, Shape{0}),
                                destinations.back());
    sources.push_back(std::move(tensor));
  }
  const int64_t bytes = count * elements * 4;
  const double rss_state = PeakRssMib();  // Sources + destinations.

  FileSystemWriterOptions writer_options;
  writer_options.io_engine = engine->get();
  writer_options.direct_io = direct;
  writer_options.thread_count = threads;
  FileSystemWriter writer(dir, writer_options);
  auto start = std::chrono::steady_clock::now();
  absl::Status saved = testing::SaveOneRank(writer, save_planner);
  const double save_seconds = Since(start);
  if (!saved.ok()) return Fail(saved);
  const double rss_save = PeakRssMib();

  if (cold) DropCache(dir);
  FileSystemReaderOptions reader_options;
  reader_options.io_engine = engine->get();
  reader_options.thread_count = threads;
  reader_options.direct_io = direct;
  FileSystemReader reader(dir, reader_options);
  start = std::chrono::steady_clock::now();
  absl::Status loaded = testing::LoadOneRank(reader, load_planner);
  const double load_seconds = Since(start);
  if (!loaded.ok()) return Fail(loaded);
  const double rss_load = PeakRssMib();

  bool verified = true;
  for (size_t t = 0; t < sources.size(); ++t) {
    verified = verified && destinations[t].BytesEqual(sources[t]);
  }
  std::printf(
      "{\"bytes\": %lld, \"tensors\": %lld, \"engine\": \"%s\", \"direct\": "
      "%s, \"threads\": %d, \"cold_load\": %s, \"save_seconds\": %.3f, "
      "\"load_seconds\": %.3f, \"save_gbps\": %.3f, \"load_gbps\": %.3f, "
      "\"peak_rss_mib_state\": %.0f, \"peak_rss_mib_after_save\": %.0f, "
      "\"peak_rss_mib_after_load\": %.0f, \"verified\": %s}\n",
      static_cast<long long>(bytes), static_cast<long long>(count),
      std::string((*engine)->name()).c_str(), direct ? "true" : "false",
      threads, cold ? "true" : "false", save_seconds, load_seconds,
      bytes / save_seconds / 1e9, bytes / load_seconds / 1e9, rss_state,
      rss_save, rss_load, verified ? "true" : "false");
  return verified ? 0 : 2;
}
