#include "comm/rendezvous.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dcp::comm {
namespace {

struct RankVariables {
  const char* rank;
  const char* size;
};

constexpr RankVariables kRankVariables[] = {
    {"DCP_RANK", "DCP_WORLD_SIZE"},
    {"RANK", "WORLD_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
};

constexpr const char* kLocalRankVariables[] = {"LOCAL_RANK", "SLURM_LOCALID",
                                               "OMPI_COMM_WORLD_LOCAL_RANK"};

absl::StatusOr<int> ParseInt(const char* name, const std::string& value) {
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "environment variable %s=\"%s\" is not an integer", name, value));
  }
  return parsed;
}

}  // namespace

std::string StoreAddress::ToString() const {
  if (kind == Kind::kRedis) return absl::StrCat("redis://", host, ":", port);
  return path;
}

absl::StatusOr<StoreAddress> ParseStoreAddress(absl::string_view address) {
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "rendezvous address is empty: give a shared directory or "
        "redis://host:port");
  }
  StoreAddress out;
  if (absl::StartsWith(address, "redis://")) {
    absl::string_view rest = address.substr(8);
    while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    const size_t colon = rest.rfind(':');
    out.kind = StoreAddress::Kind::kRedis;
    out.host = std::string(rest.substr(0, colon));
    if (colon != absl::string_view::npos) {
      int port = 0;
      if (!absl::SimpleAtoi(rest.substr(colon + 1), &port) || port <= 0 ||
          port > 65535) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rendezvous address \"", address, "\" has a bad port"));
      }
      out.port = port;
    }
    if (out.host.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous address \"", address, "\" has no host"));
    }
    return out;
  }
  if (absl::StrContains(address, "://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous address \"", address,
                     "\" has an unsupported scheme: use a shared directory or "
                     "redis://host:port"));
  }
  out.kind = StoreAddress::Kind::kFile;
  out.path = std::string(address);
  return out;
}

EnvLookup ProcessEnvironment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

EnvLookup MapEnvironment(std::map<std::string, std::string> vars) {
  return
      [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
        auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
      };
}

std::string JobIdFromEnvironment(const EnvLookup& env) {
  auto get = [&](const char* name) {
    std::optional<std::string> value = env(name);
    return value.has_value() ? *value : std::string();
  };
  if (std::string id = get("DCP_JOB_ID"); !id.empty()) return id;
  if (std::string job = get("SLURM_JOB_ID"); !job.empty()) {
    const std::string step = get("SLURM_STEP_ID");
    return absl::StrCat("slurm-", job, step.empty() ? "" : ".", step);
  }
  // torchrun's run id is "none" unless --rdzv-id names one: every such
  // job would share its keys. Its store's address, which torchrun gives
  // every rank of the job and no other job running beside it has, tells
  // them apart.
  if (std::string id = get("TORCHELASTIC_RUN_ID"); !id.empty()) {
    const std::string addr = get("MASTER_ADDR"), port = get("MASTER_PORT");
    if (id == "none" && !addr.empty() && !port.empty()) {
      return absl::StrCat("torch-", addr, ":", port);
    }
    return absl::StrCat("torch-", id);
  }
  if (std::string id = get("OMPI_MCA_ess_base_jobid"); !id.empty()) {
    return absl::StrCat("ompi-", id);
  }
  return "";
}

absl::StatusOr<RendezvousInfo> RendezvousFromEnvironment(const EnvLookup& env) {
  RendezvousInfo info;
  info.job_id = JobIdFromEnvironment(env);
  for (const RankVariables& vars : kRankVariables) {
    std::optional<std::string> rank = env(vars.rank);
    std::optional<std::string> size = env(vars.size);
    if (!rank.has_value() && !size.has_value()) continue;
    if (!rank.has_value() || !size.has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is set but %s is not: set both (rank and world size)",
          rank.has_value() ? vars.rank : vars.size,
          rank.has_value() ? vars.size : vars.rank));
    }
    absl::StatusOr<int> r = ParseInt(vars.rank, *rank);
    if (!r.ok()) return r.status();
    absl::StatusOr<int> n = ParseInt(vars.size, *size);
    if (!n.ok()) return n.status();
    if (*n < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s=%d: the world size must be at least 1", vars.size, *n));
    }
    if (*r < 0 || *r >= *n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s=%d is outside [0, %s=%d)", vars.rank, *r, vars.size, *n));
    }
    info.rank = *r;
    info.world_size = *n;
    info.rank_source = absl::StrCat(vars.rank, "/", vars.size);
    break;
  }
  for (const char* name : kLocalRankVariables) {
    std::optional<std::string> value = env(name);
    if (!value.has_value()) continue;
    absl::StatusOr<int> local = ParseInt(name, *value);
    if (!local.ok()) return local.status();
    info.local_rank = *local;
    break;
  }
  if (std::optional<std::string> addr = env("DCP_COMM_ADDR");
      addr.has_value() && !addr->empty()) {
    info.listen_address = *addr;
  } else {
    for (const char* name : {"DCP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
      std::optional<std::string> iface = env(name);
      if (!iface.has_value() || iface->empty()) continue;
      info.listen_interface = *iface;
      break;
    }
  }
  std::optional<std::string> store = env("DCP_RENDEZVOUS");
  if (store.has_value() && !store->empty()) {
    absl::StatusOr<StoreAddress> parsed = ParseStoreAddress(*store);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("DCP_RENDEZVOUS: ", parsed.status().message()));
    }
    info.store = *std::move(parsed);
  } else if (info.world_size > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "DCP_RENDEZVOUS is not set: a world of %d ranks (from %s) needs a "
        "meeting point; set it to a directory all ranks share or to "
        "redis://host:port (`dcp launch` sets it for local ranks)",
        info.world_size, info.rank_source));
  }
  return info;
}

}  // namespace dcp::comm
