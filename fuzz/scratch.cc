#include "fuzz/scratch.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/status.h"
#include "fuzz/fuzz_check.h"
#include "planner/default_planner.h"

namespace dcp::fuzz {

Scratch& GetScratch() {
  static Scratch* scratch = [] {
    auto* s = new Scratch;
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string base = tmp != nullptr ? tmp
                             : std::filesystem::is_directory("/dev/shm")
                                 ? "/dev/shm"
                                 : "/tmp";
    std::string pattern = base + "/dcp-fuzzer-XXXXXX";
    DCP_FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr,
                   "cannot create the scratch directory");
    s->dir = pattern;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(GetScratch().dir, ignored);
    });
    IoEngineOptions options;
    options.mode = IoMode::kPosix;
    options.threads = 2;
    s->engine = NewPosixIoEngine(options);
    return s;
  }();
  return *scratch;
}

void WriteWholeFile(const std::string& path, absl::string_view bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
}

absl::Status LoadOneRank(StorageReader& reader, const Metadata& metadata,
                         StateDict& state_dict) {
  DefaultLoadPlanner planner;
  DCP_RETURN_IF_ERROR(planner.SetUp(&state_dict, metadata, true));
  DCP_RETURN_IF_ERROR(reader.SetUp(metadata, true));
  DCP_ASSIGN_OR_RETURN(LoadPlan plan, planner.CreateLocalPlan());
  DCP_ASSIGN_OR_RETURN(plan, reader.PrepareLocalPlan(std::move(plan)));
  std::vector<LoadPlan> plans;
  plans.push_back(std::move(plan));
  DCP_ASSIGN_OR_RETURN(plans, planner.CreateGlobalPlan(std::move(plans)));
  DCP_ASSIGN_OR_RETURN(plans, reader.PrepareGlobalPlan(std::move(plans)));
  DCP_FUZZ_CHECK(plans.size() == 1, "one local plan gave another count");
  DCP_ASSIGN_OR_RETURN(plan, planner.FinishPlan(std::move(plans[0])));
  return reader.ReadData(plan, planner).Wait();
}

}  // namespace dcp::fuzz
