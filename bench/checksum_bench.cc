// XXH3 throughput: dcp's Checksum (core/checksum.h: the AVX2 build where
// the CPU has it) against libxxhash's XXH3_64bits (the reference, built for
// SSE2 on Debian) and memcpy, over one checksum block at a time (4 MiB, as
// FileSystemWriter's default checksum_block_size) of buffers that stay in
// cache or do not.
//
//   bazel run -c opt //bench:checksum_bench -- [--mib 4,32,256] [--reps 5]
//
// Each repetition alternates the variants; printed per buffer size: the
// median GB/s of each and dcp's over the library's.
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/bench_env.h"
#include "core/checksum.h"

namespace {

constexpr size_t kBlock = size_t{4} << 20;

// GB/s of `fn(offset, length)` over every block of `bytes`, repeated until
// 4 GiB have passed.
template <typename Fn>
double Rate(size_t bytes, Fn fn) {
  const size_t rounds = std::max<size_t>(1, (size_t{4} << 30) / bytes);
  const auto start = std::chrono::steady_clock::now();
  for (size_t r = 0; r < rounds; ++r) {
    for (size_t off = 0; off < bytes; off += kBlock) {
      fn(off, std::min(kBlock, bytes - off));
    }
  }
  const std::chrono::duration<double> took =
      std::chrono::steady_clock::now() - start;
  return static_cast<double>(rounds * bytes) / took.count() / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("XXH3 throughput: dcp's Checksum vs libxxhash vs memcpy");
  std::vector<size_t> mibs = {4, 32, 256};
  int reps = 5;
  app.add_option("--mib", mibs, "buffer sizes, MiB")->delimiter(',');
  app.add_option("--reps", reps)->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  uint64_t sink = 0;
  for (size_t mib : mibs) {
    const size_t bytes = mib << 20;
    std::vector<unsigned char> data(bytes), copy(bytes);
    std::mt19937_64 random(mib);
    for (auto& b : data) b = static_cast<unsigned char>(random());
    std::vector<double> dcp_rate, lib_rate, memcpy_rate;
    for (int r = 0; r < reps; ++r) {
      dcp_rate.push_back(Rate(bytes, [&](size_t off, size_t n) {
        sink += dcp::Checksum(data.data() + off, n);
      }));
      lib_rate.push_back(Rate(bytes, [&](size_t off, size_t n) {
        sink += XXH3_64bits(data.data() + off, n);
      }));
      memcpy_rate.push_back(Rate(bytes, [&](size_t off, size_t n) {
        std::memcpy(copy.data() + off, data.data() + off, n);
        sink += copy[off];
      }));
    }
    const double d = dcp::Median(dcp_rate), l = dcp::Median(lib_rate);
    std::printf(
        "%4zu MiB: dcp Checksum %.1f GB/s, libxxhash XXH3_64bits %.1f GB/s "
        "(dcp %.2fx), memcpy %.1f GB/s\n",
        mib, d, l, d / l, dcp::Median(memcpy_rate));
  }
  std::printf("(checksum sink %016llx)\n",
              static_cast<unsigned long long>(sink));
  return 0;
}
