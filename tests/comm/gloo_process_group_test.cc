// Multi-process tests of GlooProcessGroup: real Gloo over tcp on 127.0.0.1,
// meeting in a FileStore under $TEST_TMPDIR, one forked process per rank.
#include "comm/gloo_process_group.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"

namespace dcp::comm {
namespace {

using ::dcp::testing::Check;
using ::dcp::testing::FreshTestDir;
using ::dcp::testing::RankExit;
using ::dcp::testing::RunRanks;

// Bytes that differ by rank, call and position, including zeros.
std::string Payload(int rank, int call, size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    out[i] = static_cast<char>((rank * 131 + call * 17 + i * 7) & 0xff);
  }
  return out;
}

// Payload sizes per rank: empty, one byte, odd, 1 MiB.
size_t SizeOf(int rank) {
  static constexpr size_t kSizes[] = {0, 1, 100003, size_t{1} << 20};
  return kSizes[rank % 4];
}

// `store` is a directory or a redis:// address.
GlooOptions Options(const std::string& store, int rank, int size,
                    absl::Duration timeout) {
  GlooOptions options;
  options.rank = rank;
  options.world_size = size;
  options.store = *ParseStoreAddress(store);
  options.timeout = timeout;
  options.connect_timeout = absl::Seconds(10);
  return options;
}

// A pipe made before the ranks fork: a rank that must stay alive but silent
// blocks in Hold() until the ranks it stalls have seen their error and
// called Release(), so no test sleeps for "long enough".
class Gate {
 public:
  Gate() { EXPECT_EQ(::pipe(fds_), 0); }
  ~Gate() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  // Blocks until Release() was called `n` times (in any process).
  void Hold(int n) {
    char byte;
    for (int i = 0; i < n; ++i) {
      if (::read(fds_[0], &byte, 1) != 1) return;  // Writers gone.
    }
  }
  void Release() { (void)!::write(fds_[1], "x", 1); }

 private:
  int fds_[2] = {-1, -1};
};

// Expects every rank but `except` (-1: none) to have exited with 0.
void ExpectAllExitedZero(const std::vector<RankExit>& exits, int except = -1) {
  for (size_t r = 0; r < exits.size(); ++r) {
    if (static_cast<int>(r) == except) continue;
    EXPECT_TRUE(exits[r].exited && exits[r].exit_code == 0)
        << "rank " << r << ": exited=" << exits[r].exited
        << " code=" << exits[r].exit_code << " signal=" << exits[r].signal
        << " timed_out=" << exits[r].timed_out;
  }
}

// Forks `n` ranks that each join a group meeting in a fresh directory
// named `name` (default timeout `timeout`) and run `body`; expects every
// rank to exit 0.
void RunGlooRanks(const std::string& name, int n, absl::Duration timeout,
                  const std::function<int(ProcessGroup&, int)>& body) {
  const std::string dir = FreshTestDir(name);
  ExpectAllExitedZero(RunRanks(
      n,
      [&](int rank) -> int {
        auto group = GlooProcessGroup::Create(Options(dir, rank, n, timeout));
        if (!group.ok()) return Check(false, rank, group.status().ToString());
        return body(**group, rank);
      },
      absl::Seconds(30)));
}

int RunCollectives(const std::string& dir, int rank, int n) {
  auto group =
      GlooProcessGroup::Create(Options(dir, rank, n, absl::Seconds(10)));
  if (!group.ok()) return Check(false, rank, group.status().ToString());
  ProcessGroup& pg = **group;
  if (int rc = Check(pg.rank() == rank && pg.size() == n, rank, "rank/size"))
    return rc;
  for (int round = 0; round < 2; ++round) {
    const int call = round * 10;
    // Gather to root 2.
    auto gathered = pg.Gather(Payload(rank, call, SizeOf(rank)), /*root=*/2);
    if (!gathered.ok()) return Check(false, rank, gathered.status().ToString());
    if (rank == 2) {
      if (int rc = Check(gathered->size() == static_cast<size_t>(n), rank,
                         "gather count"))
        return rc;
      for (int r = 0; r < n; ++r) {
        if (int rc = Check((*gathered)[r] == Payload(r, call, SizeOf(r)), rank,
                           absl::StrCat("gather payload of rank ", r)))
          return rc;
      }
    } else if (int rc = Check(gathered->empty(), rank, "gather non-root")) {
      return rc;
    }
    // Scatter from root 1: rank r gets a payload of SizeOf(r + 1).
    std::vector<std::string> parts;
    if (rank == 1) {
      for (int r = 0; r < n; ++r)
        parts.push_back(Payload(r, call + 1, SizeOf(r + 1)));
    }
    auto scattered = pg.Scatter(parts, /*root=*/1);
    if (!scattered.ok())
      return Check(false, rank, scattered.status().ToString());
    if (int rc = Check(*scattered == Payload(rank, call + 1, SizeOf(rank + 1)),
                       rank, "scatter payload"))
      return rc;
    // Broadcast from root 3 (1 MiB).
    auto broadcast = pg.Broadcast(
        rank == 3 ? Payload(3, call + 2, SizeOf(3)) : std::string("ignored"),
        /*root=*/3);
    if (!broadcast.ok())
      return Check(false, rank, broadcast.status().ToString());
    if (int rc = Check(*broadcast == Payload(3, call + 2, SizeOf(3)), rank,
                       "broadcast payload"))
      return rc;
    // All-gather.
    auto all = pg.AllGather(Payload(rank, call + 3, SizeOf(rank + 2)));
    if (!all.ok()) return Check(false, rank, all.status().ToString());
    for (int r = 0; r < n; ++r) {
      if (int rc = Check((*all)[r] == Payload(r, call + 3, SizeOf(r + 2)), rank,
                         absl::StrCat("allgather payload of rank ", r)))
        return rc;
    }
    if (absl::Status s = pg.Barrier(); !s.ok())
      return Check(false, rank, s.ToString());
    // Statuses: odd ranks report an error.
    auto statuses = AllGatherStatuses(
        pg, rank % 2 ? absl::ResourceExhaustedError(
                           absl::StrCat("rank ", rank, " disk full"))
                     : absl::OkStatus());
    if (!statuses.ok()) return Check(false, rank, statuses.status().ToString());
    for (int r = 0; r < n; ++r) {
      const absl::Status want = r % 2
                                    ? absl::ResourceExhaustedError(absl::StrCat(
                                          "rank ", r, " disk full"))
                                    : absl::OkStatus();
      if (int rc = Check((*statuses)[r] == want, rank,
                         absl::StrCat("status of rank ", r)))
        return rc;
    }
  }
  return 0;
}

TEST(GlooProcessGroupTest, FourRanksMoveExactBytes) {
  const std::string dir = FreshTestDir("four_ranks");
  ExpectAllExitedZero(RunRanks(
      4, [&](int rank) { return RunCollectives(dir, rank, 4); },
      absl::Seconds(60)));
}

// A lost-rank scenario: `n` ranks join and meet in a barrier; then rank 1
// calls `lose` while the others run `step`, which must fail with one of
// `codes`, naming `op` and rank 1; a later call on the group then fails as
// broken. A rank that is alive but silent holds `gate` until the others
// have seen their error (Gate::Hold(n - 1)). No wall-clock bound is
// asserted: the codes tell a detected loss (kUnavailable) from a timeout.
struct LossCase {
  std::string name;
  int n = 3;
  absl::Duration timeout;
  // When set, the deadline of ranks other than 0 and 1 (for a case where
  // rank 0 must give up first).
  std::optional<absl::Duration> others_timeout;
  std::function<void()> lose;
  Gate* gate = nullptr;  // Released by every survivor when it is done.
  std::function<absl::Status(ProcessGroup&)> step;
  std::vector<absl::StatusCode> codes;
  std::string op;
  // When set, what rank 0's error must also say.
  std::string rank0_says;
  std::string store;  // Empty: a fresh directory named after the case.
};

int SurviveLoss(const LossCase& c, const std::string& dir, int rank) {
  const absl::Duration timeout =
      rank > 1 ? c.others_timeout.value_or(c.timeout) : c.timeout;
  auto group = GlooProcessGroup::Create(Options(dir, rank, c.n, timeout));
  if (!group.ok()) return Check(false, rank, group.status().ToString());
  // Everyone is connected before rank 1 goes (however late a rank starts:
  // only the step is timed).
  if (absl::Status s = (*group)->Barrier(absl::Seconds(10)); !s.ok()) {
    return Check(false, rank, s.ToString());
  }
  if (rank == 1) {
    c.lose();
    return 0;
  }
  // Survivors let a held rank 1 go however they leave.
  struct ReleaseOnExit {
    Gate* gate;
    ~ReleaseOnExit() {
      if (gate != nullptr) gate->Release();
    }
  } release{c.gate};
  const absl::Time start = absl::Now();
  const absl::Status s = c.step(**group);
  const absl::Duration took = absl::Now() - start;
  std::fprintf(stderr, "[rank %d] after %s: %s\n", rank,
               absl::FormatDuration(took).c_str(), s.ToString().c_str());
  const bool code_ok =
      std::find(c.codes.begin(), c.codes.end(), s.code()) != c.codes.end();
  if (int rc = Check(code_ok, rank, absl::StrCat("code: ", s.ToString()))) {
    return rc;
  }
  if (int rc = Check(
          absl::StrContains(s.message(), "rank 1 ") &&
              absl::StrContains(s.message(), c.op),
          rank, absl::StrCat("names rank 1, ", c.op, ": ", s.ToString()))) {
    return rc;
  }
  if (rank == 0 && !c.rank0_says.empty()) {
    if (int rc = Check(
            absl::StrContains(s.message(), c.rank0_says), rank,
            absl::StrCat("says \"", c.rank0_says, "\": ", s.ToString()))) {
      return rc;
    }
  }
  auto later = (*group)->AllGather("x");
  return Check(later.status().code() == s.code() &&
                   absl::StrContains(later.status().message(), "broken"),
               rank, absl::StrCat("later call: ", later.status().ToString()));
}

void RunLossCase(const LossCase& c) {
  const std::string dir = c.store.empty() ? FreshTestDir(c.name) : c.store;
  ExpectAllExitedZero(
      RunRanks(
          c.n, [&](int rank) { return SurviveLoss(c, dir, rank); },
          absl::Seconds(30)),
      /*except=*/1);
}

absl::Status BarrierStep(ProcessGroup& group) { return group.Barrier(); }

LossCase BarrierLoss(const std::string& name, std::function<void()> lose) {
  LossCase c;
  c.name = name;
  c.timeout = absl::Seconds(3);
  c.lose = std::move(lose);
  c.step = BarrierStep;
  c.codes = {absl::StatusCode::kUnavailable,
             absl::StatusCode::kDeadlineExceeded};
  c.op = "barrier";
  return c;
}

TEST(GlooProcessGroupTest, ExitedPeerIsNamed) {
  RunLossCase(BarrierLoss("exited_peer", [] { _exit(0); }));
}

// A surviving rank that writes to a lost one must get an error, not die of
// SIGPIPE (seen as "exited=false signal=13" in ExitedPeerIsNamed).
TEST(GlooProcessGroupTest, WriteToALostPeerIsAnErrorNotSigpipe) {
  ExpectAllExitedZero(RunRanks(
      1,
      [](int rank) -> int {
        ::signal(SIGPIPE, SIG_DFL);
        auto group = GlooProcessGroup::Create(
            Options(FreshTestDir("sigpipe"), rank, 1, absl::Seconds(3)));
        if (!group.ok()) return Check(false, rank, group.status().ToString());
        int fds[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 2;
        ::close(fds[1]);
        const ssize_t n = ::write(fds[0], "x", 1);
        return Check(
            n == -1 && errno == EPIPE, rank,
            absl::StrCat("write to a closed socket: ", n, ", errno ", errno));
      },
      absl::Seconds(30)));
}

void CountSigpipe(int) {}

TEST(GlooProcessGroupTest, AProgramsSigpipeHandlerIsKept) {
  ExpectAllExitedZero(RunRanks(
      1,
      [](int rank) -> int {
        ::signal(SIGPIPE, CountSigpipe);
        auto group = GlooProcessGroup::Create(Options(
            FreshTestDir("sigpipe_handler"), rank, 1, absl::Seconds(3)));
        if (!group.ok()) return Check(false, rank, group.status().ToString());
        struct sigaction current {};
        ::sigaction(SIGPIPE, nullptr, &current);
        return Check(current.sa_handler == CountSigpipe, rank,
                     "the program's SIGPIPE handler was replaced");
      },
      absl::Seconds(30)));
}

TEST(GlooProcessGroupTest, KilledPeerIsNamed) {
  RunLossCase(BarrierLoss("killed_peer", [] { kill(getpid(), SIGKILL); }));
}

TEST(GlooProcessGroupTest, HungPeerGivesDeadlineExceeded) {
  Gate gate;
  RunGlooRanks(
      "hung_peer", 2, absl::Seconds(30),
      [&](ProcessGroup& group, int rank) -> int {
        if (rank == 1) {
          gate.Hold(1);  // Alive but silent until rank 0 has its error.
          return 0;
        }
        const absl::Time start = absl::Now();
        auto gathered = group.Gather("plan", /*root=*/0, absl::Seconds(2));
        const absl::Duration took = absl::Now() - start;
        gate.Release();
        const absl::Status& s = gathered.status();
        std::fprintf(stderr, "[rank %d] after %s: %s\n", rank,
                     absl::FormatDuration(took).c_str(), s.ToString().c_str());
        if (int rc = Check(s.code() == absl::StatusCode::kDeadlineExceeded,
                           rank, s.ToString()))
          return rc;
        if (int rc = Check(absl::StrContains(s.message(), "gather") &&
                               absl::StrContains(s.message(), "rank 1"),
                           rank, s.ToString()))
          return rc;
        // Never before the deadline (a lower bound holds on any machine).
        return Check(took >= absl::Seconds(2), rank,
                     absl::StrCat("took ", absl::FormatDuration(took)));
      });
}

// The seed's save pattern: plans are gathered to rank 0, final plans
// scattered back. Rank 1 is lost before sending its plan. Rank 0 sees it
// directly; ranks 2 and 3, blocked on rank 0, learn rank 0's reason through
// its abort record, so every rank names rank 1 and none waits for its full
// timeout.
absl::Status SaveStep(ProcessGroup& group) {
  absl::Status s = group.Gather("local plan", 0).status();
  if (!s.ok()) return s;
  return group.Scatter({}, 0).status();
}

LossCase KilledDuringSave() {
  LossCase c;
  c.name = "killed_during_save";
  c.n = 4;
  c.timeout = absl::Seconds(5);
  // Ranks 2 and 3 learn of rank 1 from rank 0's record, never racing
  // their own deadline against it.
  c.others_timeout = absl::Seconds(20);
  c.lose = [] { kill(getpid(), SIGKILL); };
  c.step = SaveStep;
  c.codes = {absl::StatusCode::kUnavailable};
  c.op = "gather";
  // Rank 0 probes rank 1 as its connection resets, which may be before
  // the dying process's probe listener closes: it probes again and finds
  // it gone rather than waiting for a record that never comes.
  c.rank0_says = "its process is gone";
  return c;
}

TEST(GlooProcessGroupTest, KilledDuringSaveIsNamedOnEveryRank) {
  RunLossCase(KilledDuringSave());
}

// Rank 0 gives up on the silent rank 1 first (ranks 2 and 3 wait far
// longer), so they learn of rank 1 from rank 0's record. With equal
// deadlines they would give up on rank 0 at about the same moment as it
// gives up on rank 1, and might name rank 0.
TEST(GlooProcessGroupTest, HungDuringSaveIsNamedOnEveryRank) {
  LossCase c;
  c.name = "hung_during_save";
  c.n = 4;
  c.timeout = absl::Milliseconds(1500);
  c.others_timeout = absl::Seconds(20);
  Gate gate;
  c.gate = &gate;
  c.lose = [&gate, n = c.n] { gate.Hold(n - 1); };  // Alive but silent.
  c.step = SaveStep;
  c.codes = {absl::StatusCode::kDeadlineExceeded};
  c.op = "gather";
  RunLossCase(c);
}

// Runs in a child: a group made in this (parent) process would advance
// rank 0's instance count, which forked ranks of later tests inherit.
TEST(GlooProcessGroupTest, MissingRankTimesOutAtRendezvous) {
  const std::string dir = FreshTestDir("missing_rank");
  ExpectAllExitedZero(RunRanks(
      1,
      [&](int) -> int {
        GlooOptions options = Options(dir, 0, 2, absl::Seconds(5));
        options.connect_timeout = absl::Seconds(1);
        const absl::Time start = absl::Now();
        auto group = GlooProcessGroup::Create(options);
        const absl::Status s = group.status();
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return Check(absl::Now() - start >= options.connect_timeout &&
                         absl::IsDeadlineExceeded(s) &&
                         absl::StrContains(s.message(), "waiting for rank 1"),
                     0, s.ToString());
      },
      absl::Seconds(30)));
}

// Rank 1's first attempt fails before it reaches the store (its store
// directory is unusable) while rank 0's times out waiting for it; the ranks
// then try again and must meet: every attempt uses up its instance number
// on every rank, failed early or not.
TEST(GlooProcessGroupTest, RanksMeetAgainAfterAnAttemptFailedEarlyOnOne) {
  const std::string dir = FreshTestDir("retry_after_early_failure");
  const std::string not_a_dir = dir + "/file";
  { std::ofstream(not_a_dir) << "x"; }
  Gate first_attempt_over;
  ExpectAllExitedZero(RunRanks(
      2,
      [&](int rank) -> int {
        GlooOptions options =
            Options(rank == 1 ? not_a_dir : dir, rank, 2, absl::Seconds(10));
        options.connect_timeout = absl::Seconds(1);
        auto first = GlooProcessGroup::Create(options);
        if (int rc = Check(!first.ok(), rank, "first attempt succeeded")) {
          return rc;
        }
        // Rank 1 tries again only once rank 0's first attempt is over.
        if (rank == 0) {
          first_attempt_over.Release();
        } else {
          first_attempt_over.Hold(1);
        }
        GlooOptions again = Options(dir, rank, 2, absl::Seconds(10));
        auto group = GlooProcessGroup::Create(again);
        if (int rc = Check(group.ok(), rank, group.status().ToString())) {
          return rc;
        }
        absl::StatusOr<std::vector<std::string>> all =
            (*group)->AllGather(absl::StrCat(rank));
        return Check(all.ok() && *all == std::vector<std::string>{"0", "1"},
                     rank, all.status().ToString());
      },
      absl::Seconds(60)));
}

// A checkpoint group and a "training" group live side by side in the same
// processes; a background thread drives one while the main thread drives
// the other, and neither waits on or corrupts the other.
TEST(GlooProcessGroupTest, SeparateGroupsRunConcurrently) {
  const std::string dir = FreshTestDir("two_groups");
  ExpectAllExitedZero(RunRanks(
      2,
      [&](int rank) -> int {
        GlooOptions train = Options(dir, rank, 2, absl::Seconds(10));
        train.group_name = "training-loop";
        GlooOptions ckpt = Options(dir, rank, 2, absl::Seconds(10));
        auto train_group = GlooProcessGroup::Create(train);
        if (!train_group.ok())
          return Check(false, rank, train_group.status().ToString());
        auto ckpt_group = GlooProcessGroup::Create(ckpt);
        if (!ckpt_group.ok())
          return Check(false, rank, ckpt_group.status().ToString());
        absl::Status background;
        std::thread saver([&] {
          for (int i = 0; i < 50 && background.ok(); ++i) {
            auto all = (*ckpt_group)->AllGather(Payload(rank, i, 1000 + i));
            if (!all.ok()) {
              background = all.status();
            } else if ((*all)[1 - rank] != Payload(1 - rank, i, 1000 + i)) {
              background = absl::DataLossError("checkpoint payload mismatch");
            }
          }
        });
        absl::Status foreground;
        for (int i = 0; i < 50 && foreground.ok(); ++i) {
          auto b = (*train_group)->Broadcast(Payload(0, 100 + i, 77), 0);
          if (!b.ok()) {
            foreground = b.status();
          } else if (*b != Payload(0, 100 + i, 77)) {
            foreground = absl::DataLossError("training payload mismatch");
          }
        }
        saver.join();
        if (int rc = Check(background.ok(), rank, background.ToString()))
          return rc;
        return Check(foreground.ok(), rank, foreground.ToString());
      },
      absl::Seconds(60)));
}

// A second call while one is in flight on the same group is refused at
// once and does not disturb the first. Rank 0 makes two identical calls on
// two threads: whichever begins first is in flight (rank 1 holds back until
// the other was refused, so it cannot finish early) and the other is
// refused; the refusal releases rank 1, which completes the first.
TEST(GlooProcessGroupTest, OverlappingCallIsFailedPrecondition) {
  Gate refused;
  RunGlooRanks(
      "overlap", 2, absl::Seconds(30),
      [&](ProcessGroup& group, int rank) -> int {
        if (rank == 1) {
          refused.Hold(1);
          auto all = group.AllGather(Payload(1, 0, 10));
          if (!all.ok()) return Check(false, rank, all.status().ToString());
        } else {
          auto call = [&] {
            absl::StatusOr<std::vector<std::string>> all =
                group.AllGather(Payload(0, 0, 10));
            if (all.status().code() == absl::StatusCode::kFailedPrecondition) {
              refused.Release();
            }
            return all;
          };
          absl::StatusOr<std::vector<std::string>> on_thread;
          std::thread other([&] { on_thread = call(); });
          absl::StatusOr<std::vector<std::string>> here = call();
          other.join();
          const bool thread_refused = !on_thread.ok();
          const absl::StatusOr<std::vector<std::string>>& second =
              thread_refused ? on_thread : here;
          const absl::StatusOr<std::vector<std::string>>& first =
              thread_refused ? here : on_thread;
          if (int rc = Check(
                  second.status().code() ==
                          absl::StatusCode::kFailedPrecondition &&
                      absl::StrContains(second.status().message(), "in flight"),
                  rank, second.status().ToString()))
            return rc;
          if (int rc = Check(first.ok() && (*first)[1] == Payload(1, 0, 10),
                             rank, first.status().ToString()))
            return rc;
        }
        auto all = group.AllGather(Payload(rank, 1, 10));
        return Check(all.ok() && (*all)[1 - rank] == Payload(1 - rank, 1, 10),
                     rank, all.status().ToString());
      });
}

// Ranks that call different collectives are told so (kDataLoss on both),
// instead of exchanging bytes meant for another call or timing out.
TEST(GlooProcessGroupTest, MismatchedCollectivesAreDataLoss) {
  RunGlooRanks(
      "mismatch", 2, absl::Seconds(10),
      [&](ProcessGroup& group, int rank) -> int {
        const absl::Status s = rank == 0 ? group.Gather("plan", 0).status()
                                         : group.Broadcast("meta", 1).status();
        std::fprintf(stderr, "[rank %d] %s\n", rank, s.ToString().c_str());
        return Check(
            s.code() == absl::StatusCode::kDataLoss &&
                absl::StrContains(s.message(), "rank 1 is in broadcast"),
            rank, s.ToString());
      });
}

TEST(GlooProcessGroupTest, ConsecutiveJobsReuseADirectory) {
  const std::string dir = FreshTestDir("reuse");
  auto job = [&](int rank) -> int {
    auto group =
        GlooProcessGroup::Create(Options(dir, rank, 2, absl::Seconds(5)));
    if (!group.ok()) return 10 + static_cast<int>(group.status().code());
    return (*group)->Barrier().ok() ? 0 : 3;
  };
  ExpectAllExitedZero(RunRanks(2, job, absl::Seconds(30)));
  // The first job removed its keys once it had formed.
  ExpectAllExitedZero(RunRanks(2, job, absl::Seconds(30)));
}

// Jobs with job id "train-1" fail before their ranks meet: one where rank
// 1 never came, one where rank 0 never came (each lone rank times out and
// removes what it wrote, best effort). The job restarted with the same job
// id forms a fresh generation and works; so does another job beside it.
// Keys a job that crashed outright leaves (join keys with nonces nobody
// answers, a welcome, a ready key) are covered where the joining is shared:
// comm/store_process_group_test.cc and NcclProcessGroupHostTest
// CrashedJobsKeysAreNotRead.
void CrashedJobsAreLeftBehind(const std::string& store) {
  auto join = [&](int rank, int size, const std::string& job_id,
                  absl::Duration connect) -> absl::Status {
    GlooOptions options = Options(store, rank, size, absl::Seconds(5));
    options.job_id = job_id;
    options.connect_timeout = connect;
    auto group = GlooProcessGroup::Create(options);
    if (!group.ok()) return group.status();
    auto all = (*group)->AllGather(absl::StrCat("rank ", rank));
    if (!all.ok()) return all.status();
    for (int r = 0; r < size; ++r) {
      if ((*all)[r] != absl::StrCat("rank ", r)) {
        return absl::DataLossError(
            absl::StrCat("rank ", r, " sent ", (*all)[r]));
      }
    }
    return absl::OkStatus();
  };
  for (int alone : {0, 1}) {
    ExpectAllExitedZero(RunRanks(
        1,
        [&](int) -> int {
          absl::Status s = join(alone, 2, "train-1", absl::Milliseconds(300));
          return Check(absl::IsDeadlineExceeded(s), alone, s.ToString());
        },
        absl::Seconds(30)));
  }
  for (const std::string job : {"train-1", "train-1", "train-2"}) {
    ExpectAllExitedZero(RunRanks(
        2,
        [&](int rank) -> int {
          absl::Status s = join(rank, 2, job, absl::Seconds(10));
          return Check(s.ok(), rank, s.ToString());
        },
        absl::Seconds(30)));
  }
}

TEST(GlooProcessGroupTest, CrashedJobsAreLeftBehindInADirectory) {
  CrashedJobsAreLeftBehind(FreshTestDir("crashed"));
}

// The same over Gloo's RedisStore, with a private redis-server.
class GlooRedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why_not;
    bool broken = false;
    redis_ = dcp::testing::RedisServer::StartIfInstalled(&why_not, &broken);
    ASSERT_FALSE(broken) << why_not;
    if (redis_ == nullptr) GTEST_SKIP() << why_not;
  }
  std::unique_ptr<dcp::testing::RedisServer> redis_;
};

TEST_F(GlooRedisTest, FourRanksMoveExactBytes) {
  const std::string store = redis_->address();
  ExpectAllExitedZero(RunRanks(
      4, [&](int rank) { return RunCollectives(store, rank, 4); },
      absl::Seconds(60)));
}

TEST_F(GlooRedisTest, CrashedJobsAreLeftBehind) {
  CrashedJobsAreLeftBehind(redis_->address());
}

TEST_F(GlooRedisTest, KilledDuringSaveIsNamedOnEveryRank) {
  LossCase c = KilledDuringSave();
  c.store = redis_->address();
  RunLossCase(c);
}

}  // namespace
}  // namespace dcp::comm
