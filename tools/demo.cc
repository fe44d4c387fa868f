// `dcp demo`: the main job. Builds a synthetic model state, saves it, loads
// it into a fresh state, verifies every byte and prints throughput.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/process_group_factory.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "tools/commands.h"
#include "tools/machine_info.h"
#include "tools/page_cache.h"
#include "tools/synthetic_state.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
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
  while (
      i < text.size() &&
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

namespace {

// Per-rank results, combined on every rank with one AllGather.
struct DemoResult {
  int64_t bytes = 0;
  double save_seconds = 0;
  double load_seconds = 0;
  bool verified = true;
};

absl::StatusOr<DemoResult> Combine(comm::ProcessGroup* group,
                                   const DemoResult& mine) {
  if (group == nullptr) return mine;
  const std::string payload =
      absl::StrFormat("%d %.9f %.9f %d", mine.bytes, mine.save_seconds,
                      mine.load_seconds, mine.verified ? 1 : 0);
  DCP_ASSIGN_OR_RETURN(std::vector<std::string> all, group->AllGather(payload));
  DemoResult total;
  for (const std::string& entry : all) {
    long long bytes = 0;
    double save = 0, load = 0;
    int verified = 0;
    if (std::sscanf(entry.c_str(), "%lld %lf %lf %d", &bytes, &save, &load,
                    &verified) != 4) {
      return absl::DataLossError("malformed demo result from a peer");
    }
    total.bytes += bytes;
    // A collective save or load ends when the slowest rank ends.
    total.save_seconds = std::max(total.save_seconds, save);
    total.load_seconds = std::max(total.load_seconds, load);
    total.verified = total.verified && verified != 0;
  }
  return total;
}

}  // namespace

absl::Status RunDemo(const DemoFlags& flags) {
  DCP_ASSIGN_OR_RETURN(int64_t size, ParseSize(flags.size));
  // Under `dcp launch` (or torchrun, SLURM, mpirun) every rank saves its
  // part through a checkpoint process group of its own.
  DCP_ASSIGN_OR_RETURN(comm::RendezvousInfo rendezvous,
                       comm::RendezvousFromEnvironment());
  std::unique_ptr<comm::ProcessGroup> group;
  if (rendezvous.world_size > 1) {
    DCP_ASSIGN_OR_RETURN(group, comm::CreateProcessGroup(
                                    rendezvous, comm::ProcessGroupOptions{}));
  }
  const int rank = rendezvous.rank;
  const int world_size = rendezvous.world_size;

  std::string dir = flags.dir;
  bool remove_dir = false;
  if (dir.empty()) {
    if (flags.mode != "roundtrip" || world_size > 1) {
      return absl::InvalidArgumentError(
          "--mode save, --mode load and multi-rank runs need --dir");
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
  options.rank = rank;
  options.world_size = world_size;
  const bool do_save = flags.mode != "load";
  const bool do_load = flags.mode != "save";

  StateDict expected = MakeSyntheticState(options);
  DemoResult mine;
  mine.bytes = StateTensorBytes(expected);
  absl::Status verified = absl::OkStatus();

  absl::Status status = [&]() -> absl::Status {
    if (do_save) {
      SaveOptions save;
      save.checkpoint_id = dir;
      save.process_group = group.get();
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Metadata> metadata = Save(expected, save);
      mine.save_seconds = Seconds(start);
      if (!metadata.ok()) return Annotate(metadata.status(), "save");
    }
    if (do_load) {
      if (flags.cold_load && rank == 0) DropPageCache(dir);
      if (group != nullptr) DCP_RETURN_IF_ERROR(group->Barrier());
      SyntheticStateOptions dest_options = options;
      dest_options.fill = false;
      StateDict loaded = MakeSyntheticState(dest_options);
      LoadOptions load;
      load.checkpoint_id = dir;
      load.process_group = group.get();
      const auto start = std::chrono::steady_clock::now();
      absl::Status loaded_status = Load(loaded, load);
      mine.load_seconds = Seconds(start);
      if (!loaded_status.ok()) return Annotate(loaded_status, "load");
      verified = CompareStates(expected, loaded);
      mine.verified = verified.ok();
    }
    return absl::OkStatus();
  }();
  DCP_RETURN_IF_ERROR(status);
  DCP_ASSIGN_OR_RETURN(DemoResult total, Combine(group.get(), mine));

  const DirStats stats = StatDir(dir);
  // Before the directory goes: its file system and disk are part of it.
  const MachineInfo machine = DescribeMachine(dir);
  if (remove_dir) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  if (!verified.ok()) {
    return Annotate(verified, absl::StrCat("verification on rank ", rank));
  }
  if (!total.verified) {
    return absl::DataLossError("verification failed on another rank");
  }
  if (rank != 0) return absl::OkStatus();

  const double gb = static_cast<double>(total.bytes) / 1e9;
  const double save_gbps = total.save_seconds > 0 ? gb / total.save_seconds : 0;
  const double load_gbps = total.load_seconds > 0 ? gb / total.load_seconds : 0;
  if (flags.json) {
    std::printf(
        "{\"bytes\": %lld, \"ranks\": %d, \"files\": %lld, "
        "\"file_bytes\": %lld, \"save_seconds\": %.6f, "
        "\"load_seconds\": %.6f, \"save_gbps\": %.4f, "
        "\"load_gbps\": %.4f, \"verified\": %s, \"mode\": \"%s\", "
        "\"cold_load\": %s}\n",
        static_cast<long long>(total.bytes), world_size,
        static_cast<long long>(stats.files),
        static_cast<long long>(stats.bytes), total.save_seconds,
        total.load_seconds, save_gbps, load_gbps, do_load ? "true" : "null",
        flags.mode.c_str(), flags.cold_load ? "true" : "false");
    return absl::OkStatus();
  }
  std::printf("dcp demo (%s, %d rank%s, dir %s%s)\n", flags.mode.c_str(),
              world_size, world_size == 1 ? "" : "s", dir.c_str(),
              remove_dir ? ", removed afterwards" : "");
  std::printf("  %-22s %s\n", "machine", MachineSummary(machine).c_str());
  std::printf("  %-22s %s\n", "state bytes",
              absl::StrFormat("%d (%.3f GB)", total.bytes, gb).c_str());
  std::printf("  %-22s %lld files, %lld bytes\n", "checkpoint",
              static_cast<long long>(stats.files),
              static_cast<long long>(stats.bytes));
  if (do_save) {
    std::printf("  %-22s %.3f s  %.3f GB/s\n", "save", total.save_seconds,
                save_gbps);
  }
  if (do_load) {
    std::printf("  %-22s %.3f s  %.3f GB/s%s\n", "load", total.load_seconds,
                load_gbps, flags.cold_load ? " (page cache dropped)" : "");
    std::printf("  %-22s %s\n", "verify (every byte)", "ok");
  }
  return absl::OkStatus();
}

}  // namespace dcp
