// `dcp demo`: the main job. Builds a synthetic model state, saves it, loads
// it into a fresh state, verifies every byte and prints throughput.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "tools/commands.h"
#include "tools/synthetic_state.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       start)
      .count();
}

// Drops the page-cache pages of every file under `dir`, so the load that
// follows reads from the disk rather than from memory.
void DropPageCache(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::recursive_directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct DirStats {
  int64_t files = 0;
  int64_t bytes = 0;
};

DirStats StatDir(const std::string& dir) {
  DirStats stats;
  std::error_code ec;
  for (const auto& entry : fs::recursive_directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    ++stats.files;
    stats.bytes += static_cast<int64_t>(entry.file_size(ec));
  }
  return stats;
}

}  // namespace

absl::StatusOr<int64_t> ParseSize(const std::string& text) {
  std::string digits;
  size_t i = 0;
  while (i < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    digits.push_back(text[i++]);
  }
  const std::string unit = absl::AsciiStrToLower(text.substr(i));
  double value = 0;
  if (digits.empty() || !absl::SimpleAtod(digits, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad size \"", text, "\"; expected e.g. 1GiB or 256MiB"));
  }
  double scale = 1;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kib" || unit == "kb") {
    scale = 1024.0;
  } else if (unit == "m" || unit == "mib" || unit == "mb") {
    scale = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gib" || unit == "gb") {
    scale = 1024.0 * 1024 * 1024;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad size unit in \"", text, "\"; use B, KiB, MiB or GiB"));
  }
  return static_cast<int64_t>(value * scale);
}

absl::Status RunDemo(const DemoFlags& flags) {
  DCP_ASSIGN_OR_RETURN(int64_t size, ParseSize(flags.size));
  std::string dir = flags.dir;
  bool remove_dir = false;
  if (dir.empty()) {
    if (flags.mode != "roundtrip") {
      return absl::InvalidArgumentError(
          "--mode save and --mode load need --dir");
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/dcp-demo-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      return ErrnoError(errno, absl::StrCat("mkdtemp ", pattern));
    }
    dir = pattern;
    remove_dir = true;
  }

  SyntheticStateOptions options;
  options.total_bytes = size;
  options.seed = flags.seed;
  const bool do_save = flags.mode != "load";
  const bool do_load = flags.mode != "save";

  StateDict expected = MakeSyntheticState(options);
  const int64_t bytes = StateTensorBytes(expected);
  double save_seconds = 0, load_seconds = 0;
  absl::Status verified = absl::OkStatus();

  absl::Status status = [&]() -> absl::Status {
    if (do_save) {
      SaveOptions save;
      save.checkpoint_id = dir;
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Metadata> metadata = Save(expected, save);
      save_seconds = Seconds(start);
      if (!metadata.ok()) return Annotate(metadata.status(), "save");
    }
    if (do_load) {
      if (flags.cold_load) DropPageCache(dir);
      SyntheticStateOptions dest_options = options;
      dest_options.fill = false;
      StateDict loaded = MakeSyntheticState(dest_options);
      LoadOptions load;
      load.checkpoint_id = dir;
      const auto start = std::chrono::steady_clock::now();
      absl::Status loaded_status = Load(loaded, load);
      load_seconds = Seconds(start);
      if (!loaded_status.ok()) return Annotate(loaded_status, "load");
      verified = CompareStates(expected, loaded);
    }
    return absl::OkStatus();
  }();

  const DirStats stats = StatDir(dir);
  if (remove_dir) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  DCP_RETURN_IF_ERROR(status);

  const double gb = static_cast<double>(bytes) / 1e9;
  const double save_gbps = save_seconds > 0 ? gb / save_seconds : 0;
  const double load_gbps = load_seconds > 0 ? gb / load_seconds : 0;
  const std::string verdict =
      !do_load ? "n/a" : (verified.ok() ? "ok" : "FAILED");
  if (flags.json) {
    std::printf(
        "{\"bytes\": %lld, \"files\": %lld, \"file_bytes\": %lld, "
        "\"save_seconds\": %.6f, \"load_seconds\": %.6f, "
        "\"save_gbps\": %.4f, \"load_gbps\": %.4f, \"verified\": %s, "
        "\"mode\": \"%s\", \"cold_load\": %s}\n",
        static_cast<long long>(bytes), static_cast<long long>(stats.files),
        static_cast<long long>(stats.bytes), save_seconds, load_seconds,
        save_gbps, load_gbps,
        do_load ? (verified.ok() ? "true" : "false") : "null",
        flags.mode.c_str(), flags.cold_load ? "true" : "false");
  } else {
    std::printf("dcp demo (%s, dir %s%s)\n", flags.mode.c_str(), dir.c_str(),
                remove_dir ? ", removed afterwards" : "");
    std::printf("  %-22s %s\n", "state bytes",
                absl::StrFormat("%d (%.3f GB)", bytes, gb).c_str());
    std::printf("  %-22s %lld files, %lld bytes\n", "checkpoint",
                static_cast<long long>(stats.files),
                static_cast<long long>(stats.bytes));
    if (do_save) {
      std::printf("  %-22s %.3f s  %.3f GB/s\n", "save", save_seconds,
                  save_gbps);
    }
    if (do_load) {
      std::printf("  %-22s %.3f s  %.3f GB/s%s\n", "load", load_seconds,
                  load_gbps, flags.cold_load ? " (page cache dropped)" : "");
      std::printf("  %-22s %s\n", "verify (every byte)", verdict.c_str());
    }
  }
  if (!verified.ok()) return Annotate(verified, "verification");
  return absl::OkStatus();
}

}  // namespace dcp
