// What the Hugging Face fuzz targets (hf_index, sharding_info) share:
// safetensors files made from tensors and header metadata, and the check that a
// directory either is refused with a decoder's error or reads and loads without
// a crash.
#ifndef DCP_FUZZ_HF_FIXTURE_H_
#define DCP_FUZZ_HF_FIXTURE_H_

#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace dcp::fuzz {

// A safetensors file holding `tensors` (offsets assigned in their order)
// with `metadata` in its header, its data a fixed pattern; "" when the
// header cannot be encoded (e.g. metadata that is not valid UTF-8).
std::string SafetensorsFileOf(
    std::vector<SafetensorsTensor> tensors,
    const std::map<std::string, std::string>& metadata);

// Reads the Hugging Face checkpoint in `dir` the way a load does
// (HuggingFaceStorageReader::ReadMetadata) and aborts unless it succeeds or
// fails with a code a reader of untrusted files may return (kDataLoss,
// kNotFound for a named file that is missing, kUnimplemented for a dtype dcp
// lacks). What it reads is then loaded into host tensors of the recorded
// shapes (those within 1 MiB): the load's own errors are its to report,
// only crashes and sanitizer reports are findings.
void ReadAndLoadHfCheckpoint(const std::string& dir);

}  // namespace dcp::fuzz

#endif  // DCP_FUZZ_HF_FIXTURE_H_
