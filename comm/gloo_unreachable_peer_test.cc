// A peer whose advertised address does not answer: rank 0 is a real
// GlooProcessGroup; "rank 1" is this test, which joins the generation and
// publishes, as Gloo would, an address where nothing listens (a bound
// socket that never listens). Rank 0 reads it (the key gates it, no sleep)
// and must fail naming rank 1, that address and the connect timeout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/gloo_process_group.h"
#include "comm/internal/gloo_store.h"
#include "comm/store_process_group.h"
#include "gloo/transport/tcp/address.h"
#include "gtest/gtest.h"

namespace dcp::comm {
namespace {

TEST(GlooUnreachablePeerTest, ErrorNamesTheRankItsAddressAndTheTimeout) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/unreachable_peer");
  std::filesystem::remove_all(dir);

  // A port nothing listens on.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_storage silent{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&silent);
  v4->sin_family = AF_INET;
  v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(sockaddr_in);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&silent), length), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&silent), &length),
            0);
  const std::string silent_address =
      absl::StrCat("127.0.0.1:", ntohs(v4->sin_port));

  GlooOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.store.path = dir;
  options.group_name = "unreachable";
  options.connect_timeout = absl::Seconds(2);
  const std::string base = "unreachable/0";

  std::thread fake_rank_1([&] {
    auto store = internal::OpenStore(options.store);
    ASSERT_TRUE(store.ok()) << store.status();
    std::unique_ptr<KeyValueStore> keys = internal::AsKeyValueStore(**store);
    auto generation =
        JoinGeneration(*keys, base, 1, 2, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(generation.ok()) << generation.status();
    const std::string prefix = absl::StrCat(base, "/", *generation, "/");
    // Gloo's keys for rank 1: its host name, then one tcp address per
    // other rank.
    ASSERT_TRUE(keys->Set(prefix + "rank_1", "fake-host").ok());
    const std::vector<char> address =
        gloo::transport::tcp::Address(silent, /*seq=*/0).bytes();
    ASSERT_TRUE(
        keys->Set(prefix + "1", std::string(address.begin(), address.end()))
            .ok());
  });
  auto group = GlooProcessGroup::Create(options);
  fake_rank_1.join();
  ::close(fd);
  ASSERT_FALSE(group.ok());
  const absl::Status& s = group.status();
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  EXPECT_TRUE(absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1 at " + silent_address))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "connect timeout of 2s")) << s;
}

}  // namespace
}  // namespace dcp::comm
