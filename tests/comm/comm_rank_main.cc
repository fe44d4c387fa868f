// One rank of a launched job, for launcher tests: joins the process group
// the environment describes (as dcp_launch sets it up) and runs a few
// collectives.
//   comm_rank_main ok       all-gathers "rank R" and checks every payload;
//                           rank 0 prints what it gathered. Exit 0.
//   comm_rank_main lose K   rank K exits with code 3 after joining; the
//                           others wait in a barrier (they are stopped by
//                           the launcher, or fail naming rank K: exit 4).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/process_group_factory.h"

int main(int argc, char** argv) {
  using dcp::comm::ProcessGroupOptions;
  const std::string mode = argc > 1 ? argv[1] : "ok";
  ProcessGroupOptions options;
  options.timeout = absl::Seconds(5);
  options.connect_timeout = absl::Seconds(10);
  auto group = dcp::comm::CreateProcessGroupFromEnvironment(options);
  if (!group.ok()) {
    std::fprintf(stderr, "cannot join: %s\n",
                 group.status().ToString().c_str());
    return 2;
  }
  dcp::comm::ProcessGroup& pg = **group;
  std::printf("joined %s group as rank %d of %d\n",
              std::string(pg.backend()).c_str(), pg.rank(), pg.size());
  if (mode == "lose") {
    const int lost = argc > 2 ? std::atoi(argv[2]) : 1;
    if (pg.rank() == lost) {
      std::fflush(stdout);
      std::_Exit(3);
    }
    absl::Status s = pg.Barrier();
    std::fprintf(stderr, "barrier: %s\n", s.ToString().c_str());
    return absl::StrContains(s.message(), absl::StrCat("rank ", lost)) ? 4 : 5;
  }
  auto all = pg.AllGather(absl::StrCat("rank ", pg.rank()));
  if (!all.ok()) {
    std::fprintf(stderr, "allgather: %s\n", all.status().ToString().c_str());
    return 1;
  }
  for (int r = 0; r < pg.size(); ++r) {
    if ((*all)[r] != absl::StrCat("rank ", r)) {
      std::fprintf(stderr, "allgather: wrong payload from rank %d\n", r);
      return 1;
    }
  }
  if (pg.rank() == 0) {
    std::printf("gathered: %s\n", absl::StrJoin(*all, ",").c_str());
  }
  return pg.Barrier().ok() ? 0 : 1;
}
