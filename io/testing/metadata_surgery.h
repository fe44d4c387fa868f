// Test support for crafted checkpoints: rewrites the payload of a metadata
// file (io/format.proto) as an attacker with a protobuf library and XXH3
// could, keeping the header's length and checksum valid, so that what the
// decoder meets is exactly the crafted numbers and names.
#ifndef DCP_IO_TESTING_METADATA_SURGERY_H_
#define DCP_IO_TESTING_METADATA_SURGERY_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/format.pb.h"

namespace dcp::testing {

// Parses the payload of `bytes` (a complete metadata file), applies
// `mutate` to it and returns a metadata file holding the result, with the
// header's payload length and checksum matching it. kDataLoss when `bytes`
// has no parsable payload.
absl::StatusOr<std::string> RewritePayload(
    absl::string_view bytes, absl::FunctionRef<void(format::Metadata&)> mutate);

// The position of `fqn`'s first stored item in the storage arrays of
// `proto` (storage_name, storage_length, ...), or -1.
int StoredItemPosition(const format::Metadata& proto, absl::string_view fqn);

// Makes the stored item `fqn` claim `length` bytes with the checkpoint's
// checksum block size set to `block_size`, and gives it as many checksums
// as that takes (their values arbitrary): numbers that agree with each
// other but that no data file backs. False when there is no such item.
bool ClaimLength(format::Metadata& proto, absl::string_view fqn, int64_t length,
                 int64_t block_size);

// RewritePayload of `dir`/.metadata, written back in place.
absl::Status RewriteMetadataFile(
    const std::string& dir, absl::FunctionRef<void(format::Metadata&)> mutate);

}  // namespace dcp::testing

#endif  // DCP_IO_TESTING_METADATA_SURGERY_H_
