// What a benchmark ran on: the CPU, memory, kernel, and the file system and
// block device under its directory, read from /proc and /sys, so that a
// result file says which machine produced it (the same VM image has come up
// on different hosts, and the disk's queue settings change what it reads).
// And the CPU time and page faults of a stretch of work in this process,
// which tell where a run's time went when its throughput moves.
#ifndef DCP_TOOLS_MACHINE_INFO_H_
#define DCP_TOOLS_MACHINE_INFO_H_

#include <cstdint>
#include <string>

namespace dcp {

struct MachineInfo {
  std::string cpu_model;     // /proc/cpuinfo "model name"; empty if none.
  int cpus = 0;              // Online CPUs.
  int64_t memory_bytes = 0;  // /proc/meminfo MemTotal.
  std::string kernel;        // uname -r.
  // The directory's file system ("ext4", "tmpfs", ... or the statfs magic
  // in hex when unknown); empty when the directory cannot be examined.
  std::string file_system;
  // The whole block device that holds the directory ("vda" for a file on
  // /dev/vda1), and that device's queue settings; empty / -1 when the
  // directory is not on a block device (tmpfs, overlay) or /sys lacks it.
  std::string block_device;
  std::string scheduler;  // The active one ("mq-deadline", "none").
  int64_t read_ahead_kb = -1;
  int rotational = -1;  // 0 or 1 as the device reports it.
};

// This machine's memory in bytes (/proc/meminfo MemTotal); 0 when unknown.
int64_t MemTotalBytes();

// Describes this machine and `dir` (which must exist). Never fails: what
// cannot be read is left empty or -1.
MachineInfo DescribeMachine(const std::string& dir);

// One line for a log: "AMD EPYC, 2 CPUs, 23.4 GiB, Linux 6.18.0, ext4 on vda
// (mq-deadline, read-ahead 8192 KiB)".
std::string MachineSummary(const MachineInfo& info);

// CPU time and page faults of this process (all its threads) since Start.
class ResourceMeter {
 public:
  struct Use {
    double user_seconds = 0;
    double system_seconds = 0;
    int64_t minor_faults = 0;  // Pages mapped without I/O: first touches.
    int64_t major_faults = 0;  // Pages read in from a file.
  };

  // Starts measuring now.
  ResourceMeter();
  // What the process used since construction (or the last Restart).
  Use Elapsed() const;
  void Restart();

 private:
  Use start_;
};

}  // namespace dcp

#endif  // DCP_TOOLS_MACHINE_INFO_H_
