// Fresh staging memory: HostBuffer::Create (mapped and faulted in) of
// anonymous and shared (memfd) memory and the first write into it, against
// the reference a plain program would do: mmap and memset the same bytes.
//
//   bazel run //bench:host_buffer_bench -- [--mib N] [--reps R]
//
// Each repetition alternates the variants and maps fresh memory; printed
// per variant: the median seconds to create, to write every byte once
// afterwards (a copy into the buffer), and their sum against the plain
// mmap + memset. Fresh memory on a virtual machine is backed on first
// touch and its cost changes from minute to minute: compare within a run.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "staging/host_buffer_pool.h"

namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Times {
  std::vector<double> create, write;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Fresh staging memory: HostBuffer::Create + first write");
  int mib = 2048;
  int reps = 3;
  app.add_option("--mib", mib, "Bytes per buffer, in MiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--reps", reps, "Repetitions (variants alternate)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const size_t bytes = static_cast<size_t>(mib) << 20;
  const char* names[] = {"plain mmap + memset", "HostBuffer anonymous",
                         "HostBuffer shared (memfd)"};
  Times times[3];
  for (int rep = 0; rep < reps; ++rep) {
    for (int variant = 0; variant < 3; ++variant) {
      double t0 = Now();
      std::byte* data = nullptr;
      std::shared_ptr<dcp::HostBuffer> buffer;
      if (variant == 0) {
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
          std::perror("mmap");
          return 1;
        }
        data = static_cast<std::byte*>(p);
      } else {
        dcp::HostBufferOptions options;
        options.pinned = false;
        options.shared = variant == 2;
        auto created = dcp::HostBuffer::Create(bytes, nullptr, options);
        if (!created.ok()) {
          std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
          return 1;
        }
        buffer = *created;
        data = buffer->data();
      }
      const double t1 = Now();
      std::memset(data, rep + 1, bytes);
      const double t2 = Now();
      times[variant].create.push_back(t1 - t0);
      times[variant].write.push_back(t2 - t1);
      if (variant == 0) munmap(data, bytes);
    }
  }
  const double plain = Median(times[0].create) + Median(times[0].write);
  std::printf("%d MiB, %d reps, medians (seconds)\n", mib, reps);
  std::printf("%-28s %8s %8s %8s %10s\n", "variant", "create", "write", "sum",
              "vs plain");
  for (int variant = 0; variant < 3; ++variant) {
    const double c = Median(times[variant].create);
    const double w = Median(times[variant].write);
    std::printf("%-28s %8.3f %8.3f %8.3f %9.2fx\n", names[variant], c, w, c + w,
                (c + w) / plain);
  }
  return 0;
}
