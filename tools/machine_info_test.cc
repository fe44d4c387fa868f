#include "tools/machine_info.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;

std::string TestDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

TEST(MachineInfoTest, DescribesTheCpusMemoryAndKernel) {
  const MachineInfo info = DescribeMachine(TestDir());
  EXPECT_EQ(info.cpus, ::sysconf(_SC_NPROCESSORS_ONLN));
  // MemTotal and the page count of sysconf both come from totalram.
  EXPECT_EQ(info.memory_bytes,
            int64_t{::sysconf(_SC_PHYS_PAGES)} * ::sysconf(_SC_PAGESIZE));
  struct utsname name {};
  ASSERT_EQ(::uname(&name), 0);
  EXPECT_EQ(info.kernel, name.release);
#if defined(__x86_64__)
  EXPECT_FALSE(info.cpu_model.empty());
#endif
}

TEST(MachineInfoTest, NamesTheFileSystemOfTheDirectory) {
  EXPECT_EQ(DescribeMachine("/proc").file_system, "proc");
  EXPECT_EQ(DescribeMachine("/proc").block_device, "");
  EXPECT_EQ(DescribeMachine("/sys").file_system, "sysfs");
  EXPECT_FALSE(DescribeMachine(TestDir()).file_system.empty());
}

TEST(MachineInfoTest, FindsTheWholeDiskUnderADirectory) {
  // Every directory that /proc/mounts puts on a block device: its disk must
  // exist in /sys/block, with a queue that names a scheduler.
  int checked = 0;
  for (const std::string& dir : {std::string("/"), TestDir()}) {
    struct stat st {};
    ASSERT_EQ(::stat(dir.c_str(), &st), 0) << dir;
    const MachineInfo info = DescribeMachine(dir);
    if (major(st.st_dev) == 0) {
      EXPECT_EQ(info.block_device, "") << dir;
      continue;
    }
    ++checked;
    ASSERT_FALSE(info.block_device.empty()) << dir;
    EXPECT_TRUE(fs::exists(fs::path("/sys/block") / info.block_device))
        << info.block_device;
    EXPECT_FALSE(info.scheduler.empty());
    EXPECT_EQ(info.scheduler.find('['), std::string::npos) << info.scheduler;
    EXPECT_GE(info.read_ahead_kb, 0);
    EXPECT_TRUE(info.rotational == 0 || info.rotational == 1);
    EXPECT_NE(MachineSummary(info).find(" on " + info.block_device),
              std::string::npos)
        << MachineSummary(info);
  }
  if (checked == 0) GTEST_SKIP() << "no test directory is on a block device";
}

TEST(MachineInfoTest, AMissingDirectoryLeavesTheDiskUnknown) {
  const MachineInfo info = DescribeMachine("/no/such/dir/dcp");
  EXPECT_EQ(info.file_system, "");
  EXPECT_EQ(info.block_device, "");
  EXPECT_EQ(info.read_ahead_kb, -1);
  EXPECT_GT(info.cpus, 0);
  EXPECT_NE(MachineSummary(info).find("unknown file system"),
            std::string::npos);
}

TEST(ResourceMeterTest, CountsFirstTouchesAsMinorFaults) {
  constexpr size_t kPages = 2048;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // Fresh anonymous memory (malloc could hand back pages already touched).
  void* memory = ::mmap(nullptr, kPages * page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  // One fault per page, even where transparent huge pages are "always".
  ::madvise(memory, kPages * page, MADV_NOHUGEPAGE);
  ResourceMeter meter;
  for (size_t i = 0; i < kPages; ++i) static_cast<char*>(memory)[i * page] = 1;
  const ResourceMeter::Use use = meter.Elapsed();
  EXPECT_GE(use.minor_faults, static_cast<int64_t>(kPages) / 2);
  meter.Restart();
  for (size_t i = 0; i < kPages; ++i) static_cast<char*>(memory)[i * page] = 2;
  EXPECT_LT(meter.Elapsed().minor_faults, static_cast<int64_t>(kPages) / 4)
      << "pages already touched fault no more";
  ::munmap(memory, kPages * page);
}

TEST(ResourceMeterTest, CountsCpuTime) {
  // Spin until this process has used 50 ms of CPU by its own clock.
  auto cpu_seconds = [] {
    timespec t{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
  };
  const ResourceMeter meter;
  const double start = cpu_seconds();
  volatile uint64_t sink = 0;
  while (cpu_seconds() - start < 0.05) sink = sink + 1;
  const ResourceMeter::Use use = meter.Elapsed();
  // getrusage ticks more coarsely than the CPU clock: allow a tick's slack.
  EXPECT_GE(use.user_seconds + use.system_seconds, 0.03);
  EXPECT_LT(use.user_seconds + use.system_seconds, 5.0);
}

}  // namespace
}  // namespace dcp
