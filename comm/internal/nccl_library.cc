#include "comm/internal/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dcp::comm::internal {
namespace {

template <typename Fn>
bool Bind(void* handle, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) *missing = name;
  return *fn != nullptr;
}

absl::StatusOr<const NcclLibrary*> LoadOnce() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DCP_NCCL_LIBRARY"); env && *env) {
    candidates.push_back(env);
  }
  candidates.push_back("libnccl.so.2");
  if (const char* home = std::getenv("CUDA_HOME"); home && *home) {
    candidates.push_back(absl::StrCat(home, "/lib64/libnccl.so.2"));
  }
  candidates.push_back("/usr/local/cuda/lib64/libnccl.so.2");

  std::vector<std::string> failures;
  for (const std::string& path : candidates) {
    // RTLD_NODELETE too: even an accidental dlclose must not unload it.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle == nullptr) {
      const char* err = dlerror();
      failures.push_back(err != nullptr ? err : path);
      continue;
    }
    auto* lib = new NcclLibrary();  // Lives as long as the process.
    lib->path = path;
    std::string missing;
    ncclResult_t (*get_version)(int*) = nullptr;
    const bool ok =
        Bind(handle, "ncclGetVersion", &get_version, &missing) &&
        Bind(handle, "ncclGetUniqueId", &lib->GetUniqueId, &missing) &&
        Bind(handle, "ncclCommInitRankConfig", &lib->CommInitRankConfig,
             &missing) &&
        Bind(handle, "ncclCommAbort", &lib->CommAbort, &missing) &&
        Bind(handle, "ncclCommGetAsyncError", &lib->CommGetAsyncError,
             &missing) &&
        Bind(handle, "ncclGetErrorString", &lib->GetErrorString, &missing) &&
        Bind(handle, "ncclGetLastError", &lib->GetLastError, &missing) &&
        Bind(handle, "ncclAllGather", &lib->AllGather, &missing) &&
        Bind(handle, "ncclBroadcast", &lib->Broadcast, &missing) &&
        Bind(handle, "ncclSend", &lib->Send, &missing) &&
        Bind(handle, "ncclRecv", &lib->Recv, &missing) &&
        Bind(handle, "ncclGroupStart", &lib->GroupStart, &missing) &&
        Bind(handle, "ncclGroupEnd", &lib->GroupEnd, &missing);
    if (!ok) {
      failures.push_back(absl::StrCat(path, ": no symbol ", missing,
                                      " (NCCL older than 2.14?)"));
      delete lib;
      continue;  // The handle stays open on purpose.
    }
    get_version(&lib->version);
    return lib;
  }
  return absl::UnavailableError(absl::StrCat(
      "NCCL cannot be loaded (tried: ", absl::StrJoin(failures, "; "),
      "); install NCCL 2.14 or newer, set DCP_NCCL_LIBRARY, or use the gloo "
      "backend"));
}

}  // namespace

absl::StatusOr<const NcclLibrary*> LoadNccl() {
  static const auto* const result =
      new absl::StatusOr<const NcclLibrary*>(LoadOnce());
  return *result;
}

absl::StatusOr<std::string> NewNcclUniqueId() {
  absl::StatusOr<const NcclLibrary*> lib = LoadNccl();
  if (!lib.ok()) return lib.status();
  ncclUniqueId id;
  const ncclResult_t rc = (*lib)->GetUniqueId(&id);
  if (rc != ncclSuccess) {
    return absl::UnavailableError(
        absl::StrCat("ncclGetUniqueId: ", (*lib)->GetErrorString(rc)));
  }
  return std::string(id.internal, sizeof(id.internal));
}

}  // namespace dcp::comm::internal
