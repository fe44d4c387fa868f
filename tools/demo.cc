// `dcp demo`: the main job. Builds a synthetic model state, saves it, loads
// it into a fresh state, verifies every byte and prints throughput.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "comm/process_group_factory.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "tools/commands.h"
#include "tools/machine_info.h"
#include "tools/page_cache.h"
#include "tools/synthetic_state.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;

// The state `dcp demo` saves without --size.
constexpr int64_t kDefaultDemoBytes = int64_t{1} << 30;

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
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad size \"", text, "\": ", why, "; expected e.g. 1GiB or 256MiB"));
  };
  auto too_large = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "size \"", text, "\" is too large: at most 2^63 - 1 bytes"));
  };
  absl::string_view rest = text;
  auto digits = [&rest]() {
    size_t n = 0;
    while (n < rest.size() && absl::ascii_isdigit(rest[n])) ++n;
    absl::string_view taken = rest.substr(0, n);
    rest.remove_prefix(n);
    return taken;
  };
  const absl::string_view whole = digits();
  absl::string_view fraction;
  if (absl::ConsumePrefix(&rest, ".")) fraction = digits();
  if (whole.empty() && fraction.empty()) return bad("no number");
  const std::string unit = absl::AsciiStrToLower(rest);
  int shift = 0;
  if (unit.empty() || unit == "b") {
    shift = 0;
  } else if (unit == "k" || unit == "kib" || unit == "kb") {
    shift = 10;
  } else if (unit == "m" || unit == "mib" || unit == "mb") {
    shift = 20;
  } else if (unit == "g" || unit == "gib" || unit == "gb") {
    shift = 30;
  } else if (unit == "t" || unit == "tib" || unit == "tb") {
    shift = 40;
  } else {
    return bad("unknown unit (use B, KiB, MiB, GiB or TiB)");
  }
  const int64_t scale = int64_t{1} << shift;
  // The whole part exactly, with overflow checks; the fraction adds less
  // than one unit, rounded down to a byte.
  int64_t bytes = 0;
  if (!whole.empty() && (!absl::SimpleAtoi(whole, &bytes) ||
                         __builtin_mul_overflow(bytes, scale, &bytes))) {
    return too_large();
  }
  if (!fraction.empty()) {
    double part = 0;
    if (!absl::SimpleAtod(absl::StrCat("0.", fraction), &part)) {
      return bad("bad fraction");
    }
    const int64_t extra = std::min<int64_t>(
        static_cast<int64_t>(part * static_cast<double>(scale)), scale - 1);
    if (__builtin_add_overflow(bytes, extra, &bytes)) {
      return too_large();
    }
  }
  return bytes;
}

absl::StatusOr<uint64_t> ParseSeed(const std::string& text) {
  uint64_t seed = 0;
  if (text.empty() ||
      !std::all_of(text.begin(), text.end(),
                   [](char c) { return absl::ascii_isdigit(c); }) ||
      !absl::SimpleAtoi(text, &seed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad seed \"", text, "\"; expected an integer from 0 to ",
                     std::numeric_limits<uint64_t>::max()));
  }
  return seed;
}

namespace {

// The global shape of kSyntheticSizeTensor in the checkpoint in `dir`
// (which gives the size of the synthetic state it holds).
absl::StatusOr<Shape> CheckpointSizeTensorShape(const std::string& dir) {
  FileSystemReader reader(dir);
  DCP_ASSIGN_OR_RETURN(Metadata metadata, reader.ReadMetadata());
  auto value = metadata.state_dict_metadata.find(kSyntheticSizeTensor);
  const auto* tensor = value == metadata.state_dict_metadata.end()
                           ? nullptr
                           : std::get_if<TensorStorageMetadata>(&value->second);
  if (tensor == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint in ", dir,
                     " holds no dcp demo state (it has no tensor ",
                     kSyntheticSizeTensor, ")"));
  }
  return tensor->size;
}

// The size of state to load from `dir`: the checkpoint's when `size_flag`
// is empty, else `size` if it is the checkpoint's.
absl::StatusOr<int64_t> LoadedStateBytes(const std::string& dir,
                                         const std::string& size_flag,
                                         int64_t size) {
  DCP_ASSIGN_OR_RETURN(const Shape saved, CheckpointSizeTensorShape(dir));
  absl::StatusOr<int64_t> saved_bytes = SyntheticTotalBytesForShape(saved);
  if (!saved_bytes.ok()) {
    return Annotate(saved_bytes.status(),
                    absl::StrCat("the checkpoint in ", dir));
  }
  if (size_flag.empty()) return *saved_bytes;
  const Shape asked = SyntheticSizeTensorShape(size);
  if (asked != saved) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--size ", size_flag, " makes ", kSyntheticSizeTensor, " ",
        ShapeToString(asked), ", but the checkpoint in ", dir, " holds ",
        ShapeToString(saved), " (saved with --size ", *saved_bytes,
        " or near it); leave --size out to load the checkpoint's"));
  }
  return size;
}

// OK when `size` bytes of state, spread over `world_size` ranks that each
// hold `copies` copies of their share, fit in this machine's memory (the
// ranks of a multi-rank run may each have a machine of their own).
absl::Status CheckFitsInMemory(const std::string& size_flag, int64_t size,
                               int world_size, int copies) {
  const int64_t memory = MemTotalBytes();
  if (memory <= 0) return absl::OkStatus();  // Unknown: nothing to check.
  const int64_t share = size / world_size + (size % world_size != 0 ? 1 : 0);
  if (share <= memory / copies) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--size ", size_flag.empty() ? absl::StrCat(size) : size_flag, " (", size,
      " bytes) does not fit in this machine's memory (", memory,
      " bytes): each of ", world_size, " rank(s) would hold ", copies, " cop",
      copies == 1 ? "y" : "ies", " of ", share, " bytes"));
}

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
  DCP_ASSIGN_OR_RETURN(const uint64_t seed, ParseSeed(flags.seed));
  DCP_ASSIGN_OR_RETURN(const ExtensionChain compression,
                       ParseCompression(flags.compression));
  int64_t size = kDefaultDemoBytes;
  if (!flags.size.empty()) {
    DCP_ASSIGN_OR_RETURN(size, ParseSize(flags.size));
  }
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

  const bool do_save = flags.mode != "load";
  const bool do_load = flags.mode != "save";
  if (!do_save && !flags.dir.empty()) {
    DCP_ASSIGN_OR_RETURN(size, LoadedStateBytes(flags.dir, flags.size, size));
  }
  // Before anything is created. Loading holds the loaded state and the
  // expected one.
  DCP_RETURN_IF_ERROR(
      CheckFitsInMemory(flags.size, size, world_size, do_load ? 2 : 1));

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
  options.seed = seed;
  options.rank = rank;
  options.world_size = world_size;

  StateDict expected = MakeSyntheticState(options);
  DemoResult mine;
  mine.bytes = StateTensorBytes(expected);
  absl::Status verified = absl::OkStatus();

  absl::Status status = [&]() -> absl::Status {
    if (do_save) {
      SaveOptions save;
      save.checkpoint_id = dir;
      save.process_group = group.get();
      FileSystemWriterOptions writer_options;
      writer_options.extensions = compression;
      FileSystemWriter writer(dir, writer_options);
      if (!compression.empty()) save.storage_writer = &writer;
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
        "\"cold_load\": %s, \"compression\": \"%s\"}\n",
        static_cast<long long>(total.bytes), world_size,
        static_cast<long long>(stats.files),
        static_cast<long long>(stats.bytes), total.save_seconds,
        total.load_seconds, save_gbps, load_gbps, do_load ? "true" : "null",
        flags.mode.c_str(), flags.cold_load ? "true" : "false",
        flags.compression.c_str());
    return absl::OkStatus();
  }
  std::printf("dcp demo (%s, %d rank%s, dir %s%s)\n", flags.mode.c_str(),
              world_size, world_size == 1 ? "" : "s", dir.c_str(),
              remove_dir ? ", removed afterwards" : "");
  std::printf("  %-22s %s\n", "machine", MachineSummary(machine).c_str());
  std::printf("  %-22s %s\n", "state bytes",
              absl::StrFormat("%d (%.3f GB)", total.bytes, gb).c_str());
  std::printf("  %-22s %lld files, %lld bytes (compression %s)\n", "checkpoint",
              static_cast<long long>(stats.files),
              static_cast<long long>(stats.bytes), flags.compression.c_str());
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
