// A failed GlooProcessGroup creation removes what it wrote in the
// rendezvous store (best effort), so a long-lived store does not fill with
// failed attempts. Ranks run as threads of this process over a rendezvous
// directory; the test lists the files left in it.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "comm/gloo_process_group.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"

namespace dcp::comm {
namespace {

using ::dcp::testing::FreshTestDir;

// The files under `dir`: the keys the store holds.
std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_directory()) files.push_back(entry.path().string());
  }
  return files;
}

GlooOptions Options(const std::string& dir, const std::string& name, int rank,
                    int size) {
  GlooOptions options;
  options.rank = rank;
  options.world_size = size;
  options.store.path = dir;
  options.group_name = name;
  options.job_id = "job";
  // Both ranks must join within it (rank 0 then waits it out for rank 1's
  // address): room for a loaded or sanitizer machine.
  options.connect_timeout = absl::Seconds(6);
  options.timeout = absl::Seconds(6);
  return options;
}

// Both ranks join the generation; rank 1 cannot listen (no such network
// interface) and fails at once, rank 0 when rank 1's address does not come
// within its connect timeout. Whichever fails last removes every key.
TEST(GlooFailedCreationTest, AFailureAfterJoiningLeavesNoKeys) {
  const std::string dir = FreshTestDir("gloo_failed_mesh");
  absl::Status rank1;
  std::thread other([&] {
    GlooOptions options = Options(dir, "mesh", 1, 2);
    options.listen_interface = "dcp-no-such-if";
    rank1 = GlooProcessGroup::Create(options).status();
  });
  const absl::Status rank0 =
      GlooProcessGroup::Create(Options(dir, "mesh", 0, 2)).status();
  other.join();
  EXPECT_EQ(rank1.code(), absl::StatusCode::kInvalidArgument) << rank1;
  EXPECT_FALSE(rank0.ok());
  const std::vector<std::string> left = FilesUnder(dir);
  EXPECT_TRUE(left.empty()) << absl::StrJoin(left, "\n");
}

// Rank 1 never comes: rank 0 fails joining, and removes the record of why
// (it welcomed nobody, so nobody reads it).
TEST(GlooFailedCreationTest, AFailedJoinLeavesNoKeys) {
  const std::string dir = FreshTestDir("gloo_failed_join");
  GlooOptions options = Options(dir, "join", 0, 2);
  options.connect_timeout = absl::Milliseconds(1);
  const absl::Status rank0 = GlooProcessGroup::Create(options).status();
  EXPECT_EQ(rank0.code(), absl::StatusCode::kDeadlineExceeded) << rank0;
  const std::vector<std::string> left = FilesUnder(dir);
  EXPECT_TRUE(left.empty()) << absl::StrJoin(left, "\n");
}

}  // namespace
}  // namespace dcp::comm
