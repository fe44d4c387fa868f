// NCCL loaded at run time: libnccl.so.2 is opened with dlopen on first use
// and never closed (NCCL's bootstrap thread crashes if the library goes
// away), so binaries that link comm/ start on machines without NCCL or a
// GPU driver and only the NCCL backend reports what is missing. Internal to
// comm/; includes nccl.h for its types only.
#ifndef DCP_COMM_INTERNAL_NCCL_LIBRARY_H_
#define DCP_COMM_INTERNAL_NCCL_LIBRARY_H_

#include <string>

#include "absl/status/statusor.h"
#include "nccl.h"

namespace dcp::comm::internal {

// The NCCL entry points comm/ uses.
struct NcclLibrary {
  std::string path;  // What dlopen opened.
  int version = 0;   // ncclGetVersion.
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int,
                                     ncclConfig_t*);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  const char* (*GetErrorString)(ncclResult_t);
  const char* (*GetLastError)(ncclComm_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t,
                            ncclComm_t, cudaStream_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int,
                            ncclComm_t, cudaStream_t);
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t);
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
};

// Loads NCCL once per process (thread-safe) and returns the same library on
// every call. Tries $DCP_NCCL_LIBRARY, then libnccl.so.2 on the loader path,
// then $CUDA_HOME/lib64 and /usr/local/cuda/lib64. kUnavailable naming the
// paths tried (and dlerror) when none loads or a symbol is missing.
absl::StatusOr<const NcclLibrary*> LoadNccl();

// A fresh ncclUniqueId as bytes (needs no GPU).
absl::StatusOr<std::string> NewNcclUniqueId();

}  // namespace dcp::comm::internal

#endif  // DCP_COMM_INTERNAL_NCCL_LIBRARY_H_
