#include "comm/internal/peer_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dcp::comm::internal {
namespace {

// Parses "host:port" or "[host]:port" into `out`; false when malformed.
bool ParseHostPort(const std::string& text, sockaddr_storage* out,
                   socklen_t* length) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = text.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(text.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return false;
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::memset(out, 0, sizeof(*out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

}  // namespace

ProbeResult FromConnectError(int err, const std::string& address) {
  ProbeResult r;
  if (err == ECONNREFUSED || err == ECONNRESET) {
    r.state = ProbeResult::State::kGone;
    r.detail =
        absl::StrCat("nothing listens at ", address, ": its process is gone");
  } else {
    r.state = ProbeResult::State::kUnreachable;
    r.detail = absl::StrCat("unreachable: ", std::strerror(err));
  }
  return r;
}

std::string HostOf(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    inet_ntop(AF_INET,
              &reinterpret_cast<const sockaddr_in*>(&address)->sin_addr, text,
              sizeof(text));
  } else if (address.ss_family == AF_INET6) {
    inet_ntop(AF_INET6,
              &reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

std::string HostPortOf(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return absl::StrCat(
        HostOf(address), ":",
        ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port));
  }
  if (address.ss_family == AF_INET6) {
    return absl::StrCat(
        "[", HostOf(address), "]:",
        ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port));
  }
  return "";
}

absl::StatusOr<std::unique_ptr<ProbeListener>> ProbeListener::Open(
    const std::string& host, int backlog) {
  sockaddr_storage address;
  socklen_t length = 0;
  const std::string with_port = host.find(':') != std::string::npos
                                    ? absl::StrCat("[", host, "]:1")
                                    : absl::StrCat(host, ":1");
  if (!ParseHostPort(with_port, &address, &length)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "probe listener: \"", host, "\" is not a numeric address"));
  }
  reinterpret_cast<sockaddr_in*>(&address)->sin_port = 0;  // Same offset in v6.
  const int fd = ::socket(address.ss_family,
                          SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("probe listener on ", host, ": ", std::strerror(err)));
  }
  return std::unique_ptr<ProbeListener>(
      new ProbeListener(fd, HostPortOf(address)));
}

ProbeListener::~ProbeListener() { ::close(fd_); }

void ProbeListener::Drain() {
  for (;;) {
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    ::close(fd);
  }
}

std::vector<ProbeResult> ProbePeers(const std::vector<std::string>& addresses,
                                    absl::Duration window) {
  const absl::Time deadline = absl::Now() + window;
  std::vector<ProbeResult> results(addresses.size());
  std::vector<pollfd> pending;
  std::vector<size_t> which;
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (addresses[i].empty()) continue;
    sockaddr_storage address;
    socklen_t length = 0;
    if (!ParseHostPort(addresses[i], &address, &length)) {
      results[i] = {ProbeResult::State::kUnreachable,
                    absl::StrCat("bad probe address \"", addresses[i], "\"")};
      continue;
    }
    const int fd = ::socket(address.ss_family,
                            SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      results[i] = FromConnectError(errno, addresses[i]);
      continue;
    }
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), length) == 0) {
      ::close(fd);
      continue;
    }
    if (errno != EINPROGRESS) {
      results[i] = FromConnectError(errno, addresses[i]);
      ::close(fd);
      continue;
    }
    pending.push_back({fd, POLLOUT, 0});
    which.push_back(i);
  }
  size_t open = pending.size();
  while (open > 0) {
    // Past the deadline, one poll that does not wait still counts the
    // handshakes the kernel completed while this thread was off the CPU.
    const int64_t ms =
        std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int ready =
        ::poll(pending.data(), pending.size(), static_cast<int>(ms));
    if (ready < 0 && errno != EINTR) break;
    for (size_t k = 0; k < pending.size(); ++k) {
      if (pending[k].fd < 0 || pending[k].revents == 0) continue;
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(pending[k].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0)
        results[which[k]] = FromConnectError(err, addresses[which[k]]);
      ::close(pending[k].fd);
      pending[k].fd = -1;  // poll ignores negative descriptors.
      --open;
    }
    if (ms == 0) break;
  }
  for (size_t k = 0; k < pending.size(); ++k) {
    if (pending[k].fd < 0) continue;
    ::close(pending[k].fd);
    results[which[k]] = {ProbeResult::State::kUnreachable,
                         absl::StrCat("unreachable: no answer within ",
                                      absl::FormatDuration(window))};
  }
  return results;
}

}  // namespace dcp::comm::internal
