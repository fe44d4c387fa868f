#include "tools/machine_info.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;

// The first line of `path`, trimmed; empty when it cannot be read.
std::string FirstLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// The value of the first "key : value" line of /proc/cpuinfo with `key`.
std::string CpuInfoValue(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> parts =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    if (parts.size() == 2 && absl::StripAsciiWhitespace(parts[0]) == key) {
      return std::string(absl::StripAsciiWhitespace(parts[1]));
    }
  }
  return "";
}

// The file system type of the mount with device number `dev`, from
// /proc/self/mountinfo ("... MAJ:MIN root mount-point options ... - TYPE
// source super-options"); the last such mount wins, as it is the one on top.
std::string MountType(dev_t dev) {
  const std::string wanted = absl::StrCat(major(dev), ":", minor(dev));
  std::ifstream in("/proc/self/mountinfo");
  std::string line, type;
  while (std::getline(in, line)) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    if (fields.size() < 3 || fields[2] != wanted) continue;
    for (size_t i = 3; i + 1 < fields.size(); ++i) {
      if (fields[i] == "-") {
        type = std::string(fields[i + 1]);
        break;
      }
    }
  }
  return type;
}

// The whole disk that device `dev` belongs to ("vda" for vda1), through
// /sys/dev/block/MAJ:MIN; empty when it is not a block device.
std::string WholeBlockDevice(dev_t dev) {
  if (major(dev) == 0) return "";  // Anonymous: tmpfs, overlay, proc.
  std::error_code ec;
  fs::path node = fs::canonical(
      absl::StrCat("/sys/dev/block/", major(dev), ":", minor(dev)), ec);
  if (ec) return "";
  if (fs::exists(node / "partition", ec)) node = node.parent_path();
  return node.filename().string();
}

// "none [mq-deadline] kyber" -> "mq-deadline".
std::string ActiveScheduler(const std::string& line) {
  const size_t open = line.find('[');
  const size_t close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return line;
  return line.substr(open + 1, close - open - 1);
}

int64_t ReadInt(const fs::path& path) {
  int64_t value = -1;
  return absl::SimpleAtoi(FirstLine(path), &value) ? value : -1;
}

double Seconds(const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; }

}  // namespace

int64_t MemTotalBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "MemTotal:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, " kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(rest, &kib)) return kib * 1024;
  }
  return 0;
}

MachineInfo DescribeMachine(const std::string& dir) {
  MachineInfo info;
  info.cpu_model = CpuInfoValue("model name");
  info.cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  info.memory_bytes = MemTotalBytes();
  struct utsname name {};
  if (::uname(&name) == 0) info.kernel = name.release;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return info;
  info.file_system = MountType(st.st_dev);
  struct statfs fs_info {};
  if (info.file_system.empty() && ::statfs(dir.c_str(), &fs_info) == 0) {
    info.file_system =
        absl::StrFormat("0x%x", static_cast<uint64_t>(fs_info.f_type));
  }
  info.block_device = WholeBlockDevice(st.st_dev);
  if (info.block_device.empty()) return info;
  const fs::path queue = fs::path("/sys/block") / info.block_device / "queue";
  info.scheduler = ActiveScheduler(FirstLine(queue / "scheduler"));
  info.read_ahead_kb = ReadInt(queue / "read_ahead_kb");
  info.rotational = static_cast<int>(ReadInt(queue / "rotational"));
  return info;
}

std::string MachineSummary(const MachineInfo& info) {
  std::string text = absl::StrFormat(
      "%s, %d CPUs, %.1f GiB, Linux %s, %s",
      info.cpu_model.empty() ? "unknown CPU" : info.cpu_model, info.cpus,
      info.memory_bytes / double{1 << 30}, info.kernel,
      info.file_system.empty() ? "unknown file system" : info.file_system);
  if (!info.block_device.empty()) {
    absl::StrAppendFormat(&text, " on %s (%s, read-ahead %d KiB)",
                          info.block_device, info.scheduler,
                          info.read_ahead_kb);
  }
  return text;
}

ResourceMeter::ResourceMeter() { Restart(); }

void ResourceMeter::Restart() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  start_.user_seconds = Seconds(usage.ru_utime);
  start_.system_seconds = Seconds(usage.ru_stime);
  start_.minor_faults = usage.ru_minflt;
  start_.major_faults = usage.ru_majflt;
}

ResourceMeter::Use ResourceMeter::Elapsed() const {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  Use use;
  use.user_seconds = Seconds(usage.ru_utime) - start_.user_seconds;
  use.system_seconds = Seconds(usage.ru_stime) - start_.system_seconds;
  use.minor_faults = usage.ru_minflt - start_.minor_faults;
  use.major_faults = usage.ru_majflt - start_.major_faults;
  return use;
}

}  // namespace dcp
