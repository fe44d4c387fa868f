// Nodes as network namespaces on one machine: N namespaces, each joined by
// a veth pair to a bridge in a namespace of its own, node i at 10.77.0.<i+1>
// on interface v<i>. Traffic between the nodes crosses the veth links and
// the bridge, nothing leaves the machine (the bridge has no uplink). Made
// by the coordination benchmark (`dcp bench coord --nodes`) and the
// multi-node tests. Needs root and iproute2's `ip`.
#ifndef DCP_BENCH_COORD_NETNS_H_
#define DCP_BENCH_COORD_NETNS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dcp {

class NetworkNamespaces {
 public:
  // Names the namespaces after this process (nothing is made yet).
  explicit NetworkNamespaces(int nodes);
  // Removes every namespace Make made (their interfaces go with them).
  ~NetworkNamespaces();
  NetworkNamespaces(const NetworkNamespaces&) = delete;
  NetworkNamespaces& operator=(const NetworkNamespaces&) = delete;

  // Makes the namespaces and links. kFailedPrecondition saying why when
  // the machine does not allow it (not root, no `ip`, a step refused).
  absl::Status Make();

  int nodes() const { return nodes_; }
  // The namespace of node i, for `ip netns exec` / `ip -n`.
  std::string Node(int i) const;
  // Node i's address and interface.
  static std::string Address(int i);
  static std::string Interface(int i);

  // Moves the calling process (a child, typically) into node i's network
  // namespace. kInternal naming the namespace when setns fails.
  absl::Status Enter(int i) const;

 private:
  std::string Bridge() const;

  const int nodes_;
  const std::string tag_;
  std::vector<std::string> made_;
};

// Runs `command` through the shell; its exit code (-1 when it did not
// exit), and its stdout and stderr in *output when given.
int RunShell(const std::string& command, std::string* output = nullptr);

}  // namespace dcp

#endif  // DCP_BENCH_COORD_NETNS_H_
