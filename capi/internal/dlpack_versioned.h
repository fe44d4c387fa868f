// The DLPack 1.x managed tensor, DLManagedTensorVersioned, laid out as the
// DLPack 1.0 specification defines it. Debian ships DLPack 0.6, whose header
// lacks it; dcp/dcp.h only declares the struct, and this is the library's
// definition. The layout is ABI: a producer compiled against any DLPack 1.x
// header passes this struct, so the fields, their order and their types
// must never change.
#ifndef DCP_CAPI_INTERNAL_DLPACK_VERSIONED_H_
#define DCP_CAPI_INTERNAL_DLPACK_VERSIONED_H_

#include <dlpack/dlpack.h>

#include <cstdint>

namespace dcp::capi {

// The DLPack version a versioned tensor was produced against. Consumers
// accept the major version they know (1) and any minor version.
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

inline constexpr uint32_t kDLPackMajorVersion = 1;

// DLManagedTensorVersioned::flags bits.
inline constexpr uint64_t kDLPackFlagReadOnly = uint64_t{1} << 0;
inline constexpr uint64_t kDLPackFlagIsCopied = uint64_t{1} << 1;

}  // namespace dcp::capi

// Global, as dcp/dcp.h (and DLPack's own header) declare it.
struct DLManagedTensorVersioned {
  dcp::capi::DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

static_assert(sizeof(DLManagedTensorVersioned) ==
                  8 + sizeof(void*) * 2 + 8 + sizeof(DLTensor),
              "DLManagedTensorVersioned must match DLPack 1.x's layout");

#endif  // DCP_CAPI_INTERNAL_DLPACK_VERSIONED_H_
