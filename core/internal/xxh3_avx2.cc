// Compiled with -mavx2 (core/BUILD.bazel): only XXH3 lives here. Every
// xxHash function is static (XXH_INLINE_ALL), so none of this code can
// stand in for a function of another translation unit.
#include "core/internal/xxh3_avx2.h"

#if defined(__x86_64__) && defined(__AVX2__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>
#if XXH_VECTOR != XXH_AVX2
#error "xxhash.h did not take its AVX2 path"
#endif
#endif

namespace dcp::internal {

#if defined(__x86_64__) && defined(__AVX2__)
bool Xxh3Avx2Built() { return true; }
uint64_t Xxh3Avx2(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}
#else
bool Xxh3Avx2Built() { return false; }
uint64_t Xxh3Avx2(const void*, size_t) { __builtin_trap(); }
#endif

}  // namespace dcp::internal
