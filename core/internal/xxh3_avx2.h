// XXH3-64 (seed 0) compiled for AVX2, for core/checksum.cc's dispatch: the
// same values as libxxhash's XXH3_64bits, about 2x its speed on data in
// cache (Debian's library is built for SSE2). Call only where the CPU has
// AVX2 and Xxh3Avx2Built().
#ifndef DCP_CORE_INTERNAL_XXH3_AVX2_H_
#define DCP_CORE_INTERNAL_XXH3_AVX2_H_

#include <cstddef>
#include <cstdint>

namespace dcp::internal {

// Whether this file was compiled for AVX2 (core/BUILD.bazel gives it
// -mavx2; a build that does not, such as tools/fuzz.sh's, gets false).
bool Xxh3Avx2Built();

uint64_t Xxh3Avx2(const void* data, size_t size);

}  // namespace dcp::internal

#endif  // DCP_CORE_INTERNAL_XXH3_AVX2_H_
