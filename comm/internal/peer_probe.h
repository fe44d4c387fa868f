// Telling a lost peer from a live one after a collective failed. Each rank
// of a Gloo group keeps a listening socket (ProbeListener) whose address its
// peers learn when the group forms; a rank whose collective failed connects
// to every peer's (ProbePeers). The kernel completes the handshake for a
// live process's listener whether or not the process calls accept, so:
//   kAnswers      the peer's process is alive and its host reachable;
//   kGone         its host answered with a reset (nothing listens there:
//                 the process exited or is exiting: a listener closed
//                 with the probe queued resets it);
//   kUnreachable  no answer within the window, or no route to the host
//                 (a cut link, a host that is down).
// A listener's queue holds its backlog of probes until Drain: a full one
// drops further probes (kUnreachable), or resets them where the host sets
// net.ipv4.tcp_abort_on_overflow (kGone), so listeners are sized for every
// probe peers may send before the owner drains.
// Internal to comm/.
#ifndef DCP_COMM_INTERNAL_PEER_PROBE_H_
#define DCP_COMM_INTERNAL_PEER_PROBE_H_

#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dcp::comm::internal {

class ProbeListener {
 public:
  // Listens on `host` (a numeric IPv4 or IPv6 address) at a port the kernel
  // picks, queueing up to `backlog` probes. kUnavailable naming the address
  // when the socket cannot be made.
  static absl::StatusOr<std::unique_ptr<ProbeListener>> Open(
      const std::string& host, int backlog);
  ~ProbeListener();
  ProbeListener(const ProbeListener&) = delete;
  ProbeListener& operator=(const ProbeListener&) = delete;

  // "host:port" ("[host]:port" for IPv6): what peers pass to ProbePeers.
  const std::string& address() const { return address_; }

  // Accepts and closes the connections probes left queued. Never blocks.
  void Drain();

 private:
  ProbeListener(int fd, std::string address)
      : fd_(fd), address_(std::move(address)) {}
  const int fd_;
  const std::string address_;
};

struct ProbeResult {
  enum class State { kAnswers, kGone, kUnreachable };
  State state = State::kAnswers;
  std::string detail;  // Why, for kGone and kUnreachable.
};

// Connects to every address in `addresses` at once (an empty one is
// skipped and reported kAnswers) and waits at most `window` in all; the
// connections are closed at once. Thread-safe; blocks the caller only.
std::vector<ProbeResult> ProbePeers(const std::vector<std::string>& addresses,
                                    absl::Duration window);

// What a failed connect to `address` says about the peer: a refusal or a
// reset (ECONNREFUSED, ECONNRESET) came from its host, so the process is
// gone and the host reachable (kGone); any other error is kUnreachable.
ProbeResult FromConnectError(int err, const std::string& address);

// The numeric host of `address` ("10.0.0.1" for IPv4, without brackets
// for IPv6); "" for other families.
std::string HostOf(const sockaddr_storage& address);

// "host:port" of `address` ("[host]:port" for IPv6).
std::string HostPortOf(const sockaddr_storage& address);

}  // namespace dcp::comm::internal

#endif  // DCP_COMM_INTERNAL_PEER_PROBE_H_
