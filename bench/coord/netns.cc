#include "bench/coord/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dcp {

int RunShell(const std::string& command, std::string* output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) {
    text.append(buf, n);
  }
  const int status = ::pclose(pipe);
  if (output != nullptr) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

NetworkNamespaces::NetworkNamespaces(int nodes)
    : nodes_(nodes), tag_(absl::StrCat("dcp", ::getpid())) {}

NetworkNamespaces::~NetworkNamespaces() {
  for (const std::string& ns : made_) RunShell("ip netns del " + ns);
}

std::string NetworkNamespaces::Node(int i) const {
  return absl::StrCat(tag_, "n", i);
}
std::string NetworkNamespaces::Bridge() const { return tag_ + "b"; }
std::string NetworkNamespaces::Address(int i) {
  return absl::StrCat("10.77.0.", i + 1);
}
std::string NetworkNamespaces::Interface(int i) { return absl::StrCat("v", i); }

absl::Status NetworkNamespaces::Make() {
  if (::geteuid() != 0) {
    return absl::FailedPreconditionError("network namespaces need root");
  }
  std::string out;
  if (RunShell("ip -V", &out) != 0) {
    return absl::FailedPreconditionError(
        "the `ip` tool (iproute2) is not installed: " + out);
  }
  const std::string bridge = Bridge();
  std::vector<std::string> steps = {
      "ip netns add " + bridge,
      "ip -n " + bridge + " link add br0 type bridge",
      "ip -n " + bridge + " link set br0 up",
  };
  for (int i = 0; i < nodes_; ++i) {
    const std::string node = Node(i);
    const std::string veth = Interface(i), peer = absl::StrCat("p", i);
    steps.push_back("ip netns add " + node);
    steps.push_back(absl::StrCat("ip -n ", node, " link add ", veth,
                                 " type veth peer name ", peer, " netns ",
                                 bridge));
    steps.push_back(
        absl::StrCat("ip -n ", bridge, " link set ", peer, " master br0"));
    steps.push_back(absl::StrCat("ip -n ", bridge, " link set ", peer, " up"));
    steps.push_back(absl::StrCat("ip -n ", node, " addr add ", Address(i),
                                 "/24 dev ", veth));
    steps.push_back(absl::StrCat("ip -n ", node, " link set ", veth, " up"));
    steps.push_back(absl::StrCat("ip -n ", node, " link set lo up"));
  }
  for (const std::string& step : steps) {
    if (RunShell(step, &out) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot make network namespaces (`", step, "`): ", out));
    }
    if (step.rfind("ip netns add ", 0) == 0) made_.push_back(step.substr(13));
  }
  return absl::OkStatus();
}

absl::Status NetworkNamespaces::Enter(int i) const {
  const std::string path = "/var/run/netns/" + Node(i);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return absl::InternalError(
        absl::StrCat("setns into ", path, ": ", std::strerror(err)));
  }
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace dcp
