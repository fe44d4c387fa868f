#include "comm/internal/peer_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dcp::comm::internal {
namespace {

using State = ProbeResult::State;

TEST(PeerProbeTest, ALiveListenerAnswersAClosedOneIsGone) {
  auto live = ProbeListener::Open("127.0.0.1", 4);
  ASSERT_TRUE(live.ok()) << live.status();
  std::string closed_address;
  {
    auto closed = ProbeListener::Open("127.0.0.1", 4);
    ASSERT_TRUE(closed.ok()) << closed.status();
    closed_address = (*closed)->address();
  }
  EXPECT_TRUE(absl::StartsWith((*live)->address(), "127.0.0.1:"));
  // The window only bounds a hang: loopback answers or refuses at once.
  const std::vector<ProbeResult> results =
      ProbePeers({(*live)->address(), "", closed_address, "not-an-address"},
                 absl::Seconds(30));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0].state, State::kAnswers) << results[0].detail;
  EXPECT_EQ(results[1].state, State::kAnswers);
  EXPECT_EQ(results[2].state, State::kGone);
  EXPECT_TRUE(absl::StrContains(results[2].detail,
                                "nothing listens at " + closed_address))
      << results[2].detail;
  EXPECT_EQ(results[3].state, State::kUnreachable);
  // Probes the listener never accepted are drained; it still answers.
  (*live)->Drain();
  EXPECT_EQ(ProbePeers({(*live)->address()}, absl::Seconds(30))[0].state,
            State::kAnswers);
}

// A peer that is exiting closes its listener with probes queued: the kernel
// resets them, and the prober reads ECONNRESET instead of ECONNREFUSED. Its
// host answered, so the peer is gone, not unreachable.
TEST(PeerProbeTest, AResetMeansGone) {
  auto listener = ProbeListener::Open("127.0.0.1", 4);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const std::string address = (*listener)->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  sockaddr_in to = {};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(inet_pton(AF_INET, "127.0.0.1", &to.sin_addr), 1);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  // Queued, never accepted, as a probe of a busy peer is.
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  listener->reset();
  pollfd p = {fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 30000), 1);
  int err = 0;
  socklen_t len = sizeof(err);
  ASSERT_EQ(::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  ::close(fd);
  EXPECT_EQ(err, ECONNRESET);
  const ProbeResult reset = FromConnectError(err, address);
  EXPECT_EQ(reset.state, State::kGone);
  EXPECT_TRUE(absl::StrContains(reset.detail, "nothing listens at " + address))
      << reset.detail;
  EXPECT_EQ(FromConnectError(ECONNREFUSED, address).state, State::kGone);
  for (int unreachable : {ENETUNREACH, EHOSTUNREACH, ETIMEDOUT}) {
    EXPECT_EQ(FromConnectError(unreachable, address).state, State::kUnreachable)
        << unreachable;
  }
}

TEST(PeerProbeTest, IPv6LoopbackHasBrackets) {
  auto live = ProbeListener::Open("::1", 4);
  if (!live.ok()) GTEST_SKIP() << "no IPv6 loopback: " << live.status();
  EXPECT_TRUE(absl::StartsWith((*live)->address(), "[::1]:"));
  EXPECT_EQ(ProbePeers({(*live)->address()}, absl::Seconds(30))[0].state,
            State::kAnswers);
}

}  // namespace
}  // namespace dcp::comm::internal
