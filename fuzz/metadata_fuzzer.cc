// Fuzz target: the metadata file of a checkpoint (io/metadata_format.h
// DecodeMetadata) and the load that trusts what it returns.
//
// Each input is a whole metadata file and is tried twice: as it is (magic,
// header version, length and checksum checks), and with its header rewritten
// to match its payload (magic, version 1, length and XXH3 of the rest), so
// that mutations of the protobuf payload get past the checksum.
//
// Invariants:
//  - DecodeMetadata never crashes and fails only with kDataLoss or
//    kFailedPrecondition;
//  - what it returns encodes (EncodeMetadata), and decode(encode(decode(x)))
//    encodes to the same bytes;
//  - a load of what it returns does not crash, read outside its buffers or
//    allocate by untrusted numbers: the decoded metadata is committed into a
//    scratch checkpoint directory with data files that back its items (the
//    block checksums recomputed where their count is right, so reads get
//    past verification into the copies), and FileSystemReader with
//    DefaultLoadPlanner loads it into host tensors of the recorded shapes,
//    whole or in two shards, the way engine/checkpoint.cc loads on one rank.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/checksum.h"
#include "core/dtype.h"
#include "core/sharded_tensor.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "core/tensor.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/scratch.h"
#include "io/file_system_storage.h"
#include "io/io_engine.h"
#include "io/metadata_format.h"
#include "planner/metadata.h"
#include "planner/value_codec.h"

namespace dcp::fuzz {
namespace {

// What one load may take: data file bytes and destination tensor bytes.
// Items and tensors beyond them are left out (files truncated, tensors not
// requested), never allocated.
constexpr int64_t kMaxDataBytes = int64_t{1} << 20;
constexpr int64_t kMaxTensorBytes = int64_t{1} << 20;
constexpr size_t kMaxDataFiles = 16;

void PutLittleEndian(char* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>(value >> (8 * i));
}

// `file` with a header that matches the rest as payload.
std::string WithValidHeader(absl::string_view file) {
  std::string out(file);
  const char* payload = out.data() + kMetadataHeaderSize;
  const size_t length = out.size() - kMetadataHeaderSize;
  std::copy(kMetadataMagic, kMetadataMagic + 8, out.data());
  PutLittleEndian(out.data() + 8, kMetadataHeaderVersion, 4);
  PutLittleEndian(out.data() + 16, length, 8);
  PutLittleEndian(out.data() + 24, Checksum(payload, length), 8);
  return out;
}

// The data files `metadata` names, each as long as its last item needs
// within an even share of kMaxDataBytes, filled with a pattern; a bytes
// value's item starts with the tag of a bytes value, so that it decodes.
// Empty when the metadata names more than kMaxDataFiles files.
std::map<std::string, std::string> DataFiles(const Metadata& metadata) {
  std::map<std::string, int64_t> ends;
  for (const auto& [index, info] : metadata.storage_data) {
    int64_t& end = ends[info.relative_path];
    end = std::max(end, info.offset + info.length);  // Checked by decoding.
  }
  std::map<std::string, std::string> files;
  if (ends.size() > kMaxDataFiles) return files;
  const int64_t share = kMaxDataBytes / std::max<int64_t>(1, ends.size());
  for (const auto& [name, end] : ends) {
    std::string& bytes = files[name];
    bytes.resize(static_cast<size_t>(std::min(end, share)));
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>(i * 167 + 13);
    }
  }
  for (const auto& [index, info] : metadata.storage_data) {
    std::string& bytes = files[info.relative_path];
    if (!index.offset.has_value() && info.length > 0 &&
        info.offset < static_cast<int64_t>(bytes.size())) {
      bytes[info.offset] = static_cast<char>(ValueTag::kBytes);
    }
  }
  return files;
}

// Sets the block checksums of every item whose checksum count is right and
// whose bytes `files` hold to those of the bytes.
void MatchChecksums(const std::map<std::string, std::string>& files,
                    Metadata& metadata) {
  const int64_t block = metadata.checksum_block_size;
  for (auto& [index, info] : metadata.storage_data) {
    const std::string& bytes = files.at(info.relative_path);
    if (static_cast<int64_t>(info.block_checksums.size()) !=
            ChecksumBlockCount(info.length, block) ||
        info.offset + info.length > static_cast<int64_t>(bytes.size())) {
      continue;
    }
    for (size_t b = 0; b < info.block_checksums.size(); ++b) {
      const int64_t begin = b * block;
      const int64_t size = std::min(block, info.length - begin);
      info.block_checksums[b] = Checksum(bytes.data() + info.offset + begin,
                                         static_cast<size_t>(size));
    }
  }
}

// Host destinations for the tensors of `metadata` (within kMaxTensorBytes)
// and its bytes values: a tensor whole, or in two shards along dimension 0
// when its name's checksum is odd (deterministic, unlike absl::Hash).
StateDict Destinations(const Metadata& metadata) {
  StateDict state_dict;
  int64_t budget = kMaxTensorBytes;
  for (const auto& [fqn, value] : metadata.state_dict_metadata) {
    const auto* tensor = std::get_if<TensorStorageMetadata>(&value);
    if (tensor == nullptr) {
      state_dict.emplace(fqn, StateValue());
      continue;
    }
    const DType dtype = tensor->properties.dtype;
    const int64_t bytes = *CheckedNumBytes(dtype, tensor->size);  // Checked.
    if (bytes > budget) continue;
    budget -= bytes;
    const Shape& size = tensor->size;
    if (size.empty() || size[0] < 2 ||
        Checksum(fqn.data(), fqn.size()) % 2 == 0) {
      state_dict.emplace(fqn, Tensor::Empty(dtype, size));
      continue;
    }
    std::vector<Shard> shards(2);
    shards[0].offsets.assign(size.size(), 0);
    Shape first = size;
    first[0] = size[0] / 2;
    shards[0].tensor = Tensor::Empty(dtype, first);
    shards[1].offsets = shards[0].offsets;
    shards[1].offsets[0] = first[0];
    Shape second = size;
    second[0] = size[0] - first[0];
    shards[1].tensor = Tensor::Empty(dtype, second);
    state_dict.emplace(fqn, ShardedTensor(dtype, size, std::move(shards)));
  }
  return state_dict;
}

// Reads the metadata committed in `dir` back through a FileSystemReader and
// loads it into `state_dict` (LoadOneRank).
absl::Status RunLoad(const std::string& dir, StateDict& state_dict) {
  FileSystemReaderOptions options;
  options.direct_io = false;
  options.uncached_reads = false;
  options.io_engine = GetScratch().engine.get();
  // Small windows: items are read in pieces and copied box by box.
  options.read_window_bytes = 4096;
  FileSystemReader reader(dir, options);
  absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
  DCP_FUZZ_CHECK(metadata.ok(),
                 "the re-encoded metadata does not read back in a load");
  return LoadOneRank(reader, *metadata, state_dict);
}

void LoadFromScratch(const Metadata& decoded) {
  std::map<std::string, std::string> files = DataFiles(decoded);
  if (files.empty() && !decoded.storage_data.empty()) return;
  Metadata metadata = decoded;
  MatchChecksums(files, metadata);
  absl::StatusOr<std::string> encoded = EncodeMetadata(metadata);
  DCP_FUZZ_CHECK(encoded.ok(), "metadata with new checksums does not encode");

  const std::string& dir = GetScratch().dir;
  std::vector<std::string> written;
  for (const auto& [name, bytes] : files) {
    written.push_back(JoinPath(dir, name));  // A plain name (decoding).
    WriteWholeFile(written.back(), bytes);
  }
  written.push_back(JoinPath(dir, kMetadataFileName));
  WriteWholeFile(written.back(), *encoded);

  StateDict state_dict = Destinations(decoded);
  const absl::Status loaded = RunLoad(dir, state_dict);
  if (Verbose()) std::fprintf(stderr, "load: %s\n", loaded.ToString().c_str());
  for (const std::string& path : written) unlink(path.c_str());
}

void CheckMetadataFile(absl::string_view file) {
  absl::StatusOr<Metadata> decoded = DecodeMetadata(file, "fuzz input");
  CheckDecodeError(decoded.status(), /*allow_failed_precondition=*/true);
  if (Verbose()) {
    std::fprintf(stderr, "decode: %s\n", decoded.status().ToString().c_str());
  }
  if (!decoded.ok()) return;
  absl::StatusOr<std::string> encoded = EncodeMetadata(*decoded);
  DCP_FUZZ_CHECK(encoded.ok(), "decoded metadata does not encode");
  absl::StatusOr<Metadata> again = DecodeMetadata(*encoded, "re-encoded");
  DCP_FUZZ_CHECK(again.ok(), "re-encoded metadata does not decode");
  absl::StatusOr<std::string> encoded_again = EncodeMetadata(*again);
  DCP_FUZZ_CHECK(encoded_again.ok() && *encoded_again == *encoded,
                 "decode(encode(decode(x))) encodes differently");
  LoadFromScratch(*decoded);
}

}  // namespace
}  // namespace dcp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view file = dcp::fuzz::AsBytes(data, size);
  dcp::fuzz::CheckMetadataFile(file);
  if (size >= dcp::kMetadataHeaderSize) {
    const std::string fixed = dcp::fuzz::WithValidHeader(file);
    if (fixed != file) dcp::fuzz::CheckMetadataFile(fixed);
  }
  return 0;
}
