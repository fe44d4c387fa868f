// What a fuzz target (fuzz/<name>_fuzzer.cc) uses to state its invariants.
//
// A target defines LLVMFuzzerTestOneInput (the libFuzzer entry point). It is
// built two ways: by tools/fuzz.sh with clang and -fsanitize=fuzzer, where
// libFuzzer supplies main() and mutates inputs, and by Bazel as a cc_test
// that links fuzz/corpus_driver.cc, which replays every file of the target's
// committed corpus (fuzz/corpus/<name>/) once. A violated invariant aborts
// either way, so a reproducer added to the corpus stays a regression test.
#ifndef DCP_FUZZ_FUZZ_CHECK_H_
#define DCP_FUZZ_FUZZ_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

// Aborts, printing the condition and `message` (a C string), when
// `condition` is false. Works in both builds (assert() is compiled out of
// Bazel's -c opt).
#define DCP_FUZZ_CHECK(condition, message)                            \
  do {                                                                \
    if (!(condition)) {                                               \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s (%s)\n", \
                   __FILE__, __LINE__, #condition, message);          \
      std::abort();                                                   \
    }                                                                 \
  } while (false)

namespace dcp::fuzz {

// Whether DCP_FUZZ_VERBOSE is set in the environment: targets then print
// what each input reached (for checking that seeds get where they should).
inline bool Verbose() {
  static const bool verbose = std::getenv("DCP_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

// The input as bytes.
inline absl::string_view AsBytes(const uint8_t* data, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

// Aborts unless `status` is OK or has one of the codes a decoder of
// untrusted bytes may return (kDataLoss, plus kFailedPrecondition where
// `allow_failed_precondition`: a file from a newer dcp). Prints the status.
inline void CheckDecodeError(const absl::Status& status,
                             bool allow_failed_precondition = false) {
  if (status.ok() || absl::IsDataLoss(status) ||
      (allow_failed_precondition && absl::IsFailedPrecondition(status))) {
    return;
  }
  std::fprintf(stderr, "unexpected decode error: %s\n",
               status.ToString().c_str());
  std::abort();
}

}  // namespace dcp::fuzz

#endif  // DCP_FUZZ_FUZZ_CHECK_H_
