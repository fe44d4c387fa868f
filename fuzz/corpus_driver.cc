// main() for the Bazel build of a fuzz target: replays the committed corpus
// through LLVMFuzzerTestOneInput, so every input that ever crashed a target
// stays a regression test in `bazel test //...` (and under --config=asan).
//
// Usage: <target>_fuzzer_test PATH...   (files, or directories whose
// regular files are replayed in name order). Exits 1 when a path cannot be
// read or no input was found (an empty corpus proves nothing); a violated
// invariant aborts inside the target.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv)
    __attribute__((weak));

namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in),
              std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::error_code error;
    if (std::filesystem::is_directory(argv[i], error)) {
      std::vector<std::string> in_dir;
      for (const auto& entry :
           std::filesystem::directory_iterator(argv[i], error)) {
        if (entry.is_regular_file()) in_dir.push_back(entry.path().string());
      }
      if (error) {
        std::fprintf(stderr, "cannot list %s: %s\n", argv[i],
                     error.message().c_str());
        return 1;
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.push_back(argv[i]);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "no corpus inputs in the paths given\n");
    return 1;
  }
  std::string bytes;
  for (const std::string& file : files) {
    if (!ReadFile(file, &bytes)) {
      std::fprintf(stderr, "cannot read %s\n", file.c_str());
      return 1;
    }
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(),
                 bytes.size());
    // A copy of exactly the input's size, as libFuzzer passes it, so that
    // ASan reports a read one past the end.
    std::vector<uint8_t> input(bytes.begin(), bytes.end());
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::fprintf(stderr, "replayed %zu inputs\n", files.size());
  return 0;
}
