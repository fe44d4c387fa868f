// Fuzz target: the commit journal decoder (io/internal/commit_journal.h
// DecodeCommitJournal), which reads the journal a Hugging Face or MEGA save
// left behind; whoever opens the directory next carries out its renames and
// removals, so a hostile journal must not name a file outside the
// checkpoint.
//
// Invariants: decoding never crashes and fails only with kDataLoss; every
// rename of a decoded journal goes from a temporary name to a MEGA file
// name (the checkpoint-file test used here) in the same directory, every
// removal is a MEGA file name, and no name is absolute or has an empty,
// "." or ".." component; EncodeCommitJournal of it decodes to the same
// journal.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "fuzz/fuzz_check.h"
#include "io/internal/commit_journal.h"
#include "io/mega_format.h"

namespace {

bool IsPlainRelative(absl::string_view path) {
  if (path.empty()) return false;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

absl::string_view DirectoryOf(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? absl::string_view()
                                          : path.substr(0, slash);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dcp;
  using internal_io::CommitJournal;
  const auto is_checkpoint_file = [](absl::string_view relative) {
    return IsMegaCheckpointFileName(relative);
  };
  absl::StatusOr<CommitJournal> journal = internal_io::DecodeCommitJournal(
      fuzz::AsBytes(data, size), "fuzz-journal", is_checkpoint_file);
  if (fuzz::Verbose()) {
    std::fprintf(stderr, "decode: %s\n", journal.status().ToString().c_str());
  }
  fuzz::CheckDecodeError(journal.status());
  if (!journal.ok()) return 0;
  for (const auto& [from, to] : journal->renames) {
    DCP_FUZZ_CHECK(IsPlainRelative(from) && IsPlainRelative(to) &&
                       DirectoryOf(from) == DirectoryOf(to),
                   "a rename leaves its directory");
    DCP_FUZZ_CHECK(
        internal_io::IsTemporaryFileName(from.substr(from.rfind('/') + 1)) &&
            IsMegaCheckpointFileName(to),
        "a rename is not temporary -> checkpoint file");
  }
  for (const std::string& name : journal->removals) {
    DCP_FUZZ_CHECK(IsPlainRelative(name) && IsMegaCheckpointFileName(name),
                   "a removal names a file that is not a checkpoint file");
  }
  const std::string encoded = internal_io::EncodeCommitJournal(*journal);
  absl::StatusOr<CommitJournal> again = internal_io::DecodeCommitJournal(
      encoded, "re-encoded", is_checkpoint_file);
  DCP_FUZZ_CHECK(again.ok() && again->renames == journal->renames &&
                     again->removals == journal->removals,
                 "decode(encode(j)) differs from j");
  return 0;
}
