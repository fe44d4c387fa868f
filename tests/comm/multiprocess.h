// Helpers for tests that fork one process per rank. A rank body runs in the
// child and reports failure through its exit code and stderr (gtest
// assertions do not work across fork). The parent waits with a deadline and
// kills what is left, so a hung rank fails the test instead of hanging it.
#ifndef DCP_TESTS_COMM_MULTIPROCESS_H_
#define DCP_TESTS_COMM_MULTIPROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dcp::testing {

// What became of one rank's process.
struct RankExit {
  bool exited = false;     // Returned or called _exit.
  int exit_code = -1;      // When exited.
  int signal = 0;          // When killed by a signal.
  bool timed_out = false;  // Still running at the deadline (then killed).
};

// Forks `n` children; child r runs body(r) and _exits with its result.
// Waits until all exit or `deadline_after` passes, then SIGKILLs the rest.
std::vector<RankExit> RunRanks(int n, const std::function<int(int rank)>& body,
                               absl::Duration deadline_after);

// A fresh directory under $TEST_TMPDIR named after `name`.
std::string FreshTestDir(const std::string& name);

// In a child: prints "[rank r] message" to stderr and returns 1 when `ok`
// is false, else 0. Use as `if (int rc = Check(...)) return rc;`.
int Check(bool ok, int rank, const std::string& message);

// Reads `fd` until its text holds `wanted` (true), or to end of file or
// `deadline` (false; `*eof` says which, when given); the text read goes to
// `*out`. For waiting on a child's "ready" line.
bool ReadUntil(int fd, absl::string_view wanted, absl::Time deadline,
               std::string* out, bool* eof = nullptr);

// A private redis-server on 127.0.0.1 for the length of a test, to meet
// through Gloo's RedisStore.
class RedisServer {
 public:
  // Starts one on a free port and waits until it logs that it accepts
  // connections. nullptr, with the reason in `*why_not`, when redis-server
  // is not installed (`*broken` false: skip the test) or does not come up
  // (`*broken` true: fail it).
  static std::unique_ptr<RedisServer> StartIfInstalled(std::string* why_not,
                                                       bool* broken);
  ~RedisServer();  // Stops it.
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // "redis://127.0.0.1:<port>".
  std::string address() const;

 private:
  RedisServer(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

}  // namespace dcp::testing

#endif  // DCP_TESTS_COMM_MULTIPROCESS_H_
