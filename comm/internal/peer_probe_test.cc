#include "comm/internal/peer_probe.h"

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

TEST(PeerProbeTest, IPv6LoopbackHasBrackets) {
  auto live = ProbeListener::Open("::1", 4);
  if (!live.ok()) GTEST_SKIP() << "no IPv6 loopback: " << live.status();
  EXPECT_TRUE(absl::StartsWith((*live)->address(), "[::1]:"));
  EXPECT_EQ(ProbePeers({(*live)->address()}, absl::Seconds(30))[0].state,
            State::kAnswers);
}

}  // namespace
}  // namespace dcp::comm::internal
