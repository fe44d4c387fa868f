// Writes the seed corpora of the fuzz targets: valid encodings made by the
// encoders themselves (and, for the metadata file, by a real save), plus the
// edge cases each decoder must refuse. Run by hand when an encoding changes:
//
//   bazel run //fuzz:seed_corpus -- "$PWD/fuzz/corpus"
//
// It (over)writes the files it names under fuzz/corpus/<target>/ and leaves
// every other file there (crash reproducers) alone.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "engine/internal/write_results_codec.h"
#include "io/file_system_storage.h"
#include "io/internal/commit_journal.h"
#include "io/mega_format.h"
#include "io/metadata_format.h"
#include "io/safetensors.h"
#include "io/testing/metadata_surgery.h"
#include "io/testing/sample_state.h"
#include "planner/metadata.h"
#include "planner/plan.h"
#include "planner/plan_codec.h"
#include "planner/value_codec.h"

namespace dcp::fuzz {
namespace {

std::string root;  // argv[1]

void Write(const std::string& target, const std::string& name,
           const std::string& bytes) {
  const std::filesystem::path dir = std::filesystem::path(root) / target;
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
}

void OkOrDie(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    std::exit(1);
  }
}

template <typename T>
T OrDie(absl::StatusOr<T> value) {
  if (!value.ok()) {
    std::fprintf(stderr, "%s\n", value.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(value);
}

// Stores `length` bytes at the end of data file `file`, with the checksum
// count a reader expects (values arbitrary: the metadata target recomputes
// them).
void Store(Metadata& m, MetadataIndex index, const std::string& file,
           int64_t length, std::map<std::string, int64_t>& file_ends) {
  StorageInfo info;
  info.relative_path = file;
  info.offset = file_ends[file];
  info.length = length;
  info.block_checksums.assign(ChecksumBlockCount(length, m.checksum_block_size),
                              0x5eed);
  file_ends[file] += length;
  m.storage_data.emplace(std::move(index), std::move(info));
}

// A sharded f32 [8, 6] tensor in four 4x3 chunks over two files, a 0-d
// bf16 tensor, an empty [0, 3] i64 tensor, two values (an int and a
// string) and a nested flatten mapping, in 16-byte checksum blocks.
Metadata HandMadeMetadata() {
  Metadata m;
  m.checksum_block_size = 16;
  std::map<std::string, int64_t> ends;
  TensorStorageMetadata w;
  w.properties.dtype = DType::kF32;
  w.size = {8, 6};
  int n = 0;
  for (int64_t r : {0, 4}) {
    for (int64_t c : {0, 3}) {
      w.chunks.push_back({{r, c}, {4, 3}});
      Store(m, MetadataIndex("model.layers.0.weight", Shape{r, c}),
            absl::StrCat("__", n++ % 2, "_0.distcp"), 4 * 3 * 4, ends);
    }
  }
  m.state_dict_metadata["model.layers.0.weight"] = w;
  TensorStorageMetadata scale;
  scale.properties.dtype = DType::kBF16;
  scale.properties.requires_grad = true;
  scale.chunks.push_back({{}, {}});
  m.state_dict_metadata["model.scale"] = scale;
  Store(m, MetadataIndex("model.scale", Shape{}), "__0_0.distcp", 2, ends);
  TensorStorageMetadata empty;
  empty.properties.dtype = DType::kI64;
  empty.size = {0, 3};
  empty.chunks.push_back({{0, 0}, {0, 3}});
  m.state_dict_metadata["model.empty"] = empty;
  Store(m, MetadataIndex("model.empty", Shape{0, 0}), "__1_0.distcp", 0, ends);
  m.state_dict_metadata["optim.step"] = BytesStorageMetadata{};
  Store(m, MetadataIndex("optim.step"), "__1_0.distcp", 9, ends);
  m.state_dict_metadata["optim.groups.0.name"] = BytesStorageMetadata{};
  Store(m, MetadataIndex("optim.groups.0.name"), "__0_0.distcp", 6, ends);
  m.flatten_mapping["model.layers.0.weight"] = {"model", "layers", int64_t{0},
                                                "weight"};
  m.flatten_mapping["model.scale"] = {"model", "scale"};
  m.flatten_mapping["model.empty"] = {"model", "empty"};
  m.flatten_mapping["optim.step"] = {"optim", "step"};
  m.flatten_mapping["optim.groups.0.name"] = {"optim", "groups", int64_t{0},
                                              "name"};
  m.storage_meta = StorageMeta{"/ckpt/step-100", "save-1", "", {"model"}};
  return m;
}

// The metadata file of a real save of io/testing's sample state (seven
// tensors of six dtypes, 0-d and empty ones included, and two values) with
// 256-byte checksum blocks.
std::string SavedSampleMetadata() {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "dcp-seed-corpus").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  FileSystemWriterOptions options;
  options.checksum_block_size = 256;
  options.direct_io = false;
  options.sync_files = false;
  absl::Status saved =
      testing::SaveSample(dir, testing::SampleState::Make(7), options);
  if (!saved.ok()) {
    std::fprintf(stderr, "%s\n", saved.ToString().c_str());
    std::exit(1);
  }
  std::ifstream in(std::filesystem::path(dir) / kMetadataFileName,
                   std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  return bytes;
}

void MetadataSeeds() {
  const std::string hand_made = OrDie(EncodeMetadata(HandMadeMetadata()));
  Write("metadata", "hand_made_sharded_and_values", hand_made);
  Write("metadata", "saved_sample_state", SavedSampleMetadata());
  Write("metadata", "empty_checkpoint", OrDie(EncodeMetadata(Metadata{})));
  // Refused by the header checks.
  Write("metadata", "torn_header", hand_made.substr(0, 20));
  std::string bad_magic = hand_made;
  bad_magic[1] = 'd';
  Write("metadata", "bad_magic", bad_magic);
  std::string newer_header = hand_made;
  newer_header[8] = 2;
  Write("metadata", "header_version_2", newer_header);
  // Crafted payloads with valid checksums (issue 23's hostile checkpoints).
  auto craft = [&](const char* name, auto mutate) {
    Write("metadata", name, OrDie(testing::RewritePayload(hand_made, mutate)));
  };
  craft("format_version_dcp_2",
        [](format::Metadata& p) { p.set_version("dcp-2"); });
  craft("data_file_outside_directory",
        [](format::Metadata& p) { p.set_files(0, "../outside/__0_0.distcp"); });
  craft("scalar_claims_2e32_chunks", [](format::Metadata& p) {
    // Tensors in name order: model.empty, model.layers.0.weight, model.scale.
    p.set_tensor_chunk_count(2, std::numeric_limits<uint32_t>::max());
  });
  craft("chunk_bytes_overflow", [](format::Metadata& p) {
    // model.layers.0.weight [2^62, 6] f32, its first chunk [2^62, 3].
    p.set_tensor_size(2, int64_t{1} << 62);
    p.set_chunk_sizes(2, int64_t{1} << 62);
  });
  craft("checksum_block_2e62", [](format::Metadata& p) {
    p.set_checksum_block_size(int64_t{1} << 62);
  });
}

void PlanCodecSeeds() {
  FlattenMapping mapping = {
      {"model.layers.0.weight", {"model", "layers", int64_t{0}, "weight"}},
      {"odd.key", {"odd.key"}},
      {"list.3", {"list", int64_t{3}}}};
  Write("plan_codec", "flatten_mapping", EncodeFlattenMapping(mapping));

  SavePlan save;
  WriteItem shard;
  shard.index = MetadataIndex("model.w", Shape{4, 0}, 1);
  shard.type = WriteItemType::kShard;
  shard.tensor_data = TensorWriteData{
      {{4, 0}, {4, 6}}, {DType::kF32, false, false}, Shape{8, 6}};
  save.items.push_back(shard);
  WriteItem whole;
  whole.index = MetadataIndex("model.b", Shape{0});
  whole.tensor_data =
      TensorWriteData{{{0}, {6}}, {DType::kBF16, true, false}, Shape{6}};
  save.items.push_back(whole);
  WriteItem value;
  value.index = MetadataIndex("step");
  value.type = WriteItemType::kBytesIO;
  value.bytes_io_data = BytesIOWriteData{9};
  save.items.push_back(value);
  SavePlannerData planner_data;
  planner_data.digest = PlanDigest{0x0123456789abcdef, 0xfedcba9876543210};
  SetCompactMapping(save.items, mapping, &planner_data);
  save.planner_data = EncodeSavePlannerData(planner_data);
  save.storage_data = "__0_";
  Write("plan_codec", "save_plan", EncodeSavePlan(save));
  Write("plan_codec", "save_planner_data", save.planner_data);

  LoadPlan load;
  ReadItem read;
  read.dest_index = MetadataIndex("model.w", Shape{0, 0});
  read.dest_offsets = {4, 0};
  read.storage_index = MetadataIndex("model.w", Shape{4, 0}, 1);
  read.storage_offsets = {0, 0};
  read.lengths = {4, 6};
  load.items.push_back(read);
  ReadItem read_value;
  read_value.type = LoadItemType::kBytesIO;
  read_value.dest_index = MetadataIndex("step");
  read_value.storage_index = MetadataIndex("step");
  load.items.push_back(read_value);
  load.read_for_peers.push_back({MetadataIndex("model.w", Shape{4, 0}), {1}});
  load.received_from.push_back({MetadataIndex("step"), {0}});
  Write("plan_codec", "load_plan", EncodeLoadPlan(load));

  Write("plan_codec", "empty", "");
}

void ValueCodecSeeds() {
  Write("value_codec", "none", OrDie(EncodeValue(StateValue())));
  Write("value_codec", "int_minus_one",
        OrDie(EncodeValue(StateValue(int64_t{-1}))));
  Write(
      "value_codec", "float_nan",
      OrDie(EncodeValue(StateValue(std::numeric_limits<double>::quiet_NaN()))));
  Write("value_codec", "bool_true", OrDie(EncodeValue(StateValue(true))));
  Write("value_codec", "string_utf8",
        OrDie(EncodeValue(StateValue(std::string("h\xc3\xa9llo")))));
  Write("value_codec", "bytes_with_nul",
        OrDie(EncodeValue(StateValue(Bytes{std::string("a\0b", 3)}))));
  // Refused.
  Write("value_codec", "empty", "");
  Write("value_codec", "unknown_tag", std::string("\x06xyz"));
  Write("value_codec", "bool_byte_2", std::string("\x03\x02", 2));
  Write("value_codec", "int_short", std::string("\x01\x01\x02\x03", 4));
}

// Tensor bytes for seeds: a pattern without '}' (the safetensors target
// ends the header at the last one).
std::string DataBytes(int64_t size) {
  std::string data(static_cast<size_t>(size), '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 97);
  return data;
}

// A file of `json` preceded by its 8-byte length and followed by `data`.
std::string SafetensorsFile(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>(json.size() >> (8 * i));
  return out + json + data;
}

void SafetensorsSeeds() {
  auto encoded = [](std::vector<SafetensorsTensor> tensors,
                    std::map<std::string, std::string> metadata,
                    int64_t alignment) {
    SortForSafetensors(tensors);
    const std::string header =
        OrDie(EncodeSafetensorsHeader(tensors, metadata, alignment));
    int64_t data = 0;
    for (const SafetensorsTensor& t : tensors) data = std::max(data, t.end);
    return header + DataBytes(data);
  };
  Write("safetensors", "three_tensors_and_metadata",
        encoded({{"model.w", DType::kF32, {2, 3}},
                 {"model.b", DType::kBF16, {4}},
                 {"empty", DType::kI64, {0, 5}}},
                {{"format", "pt"}}, 8));
  Write("safetensors", "scalar_aligned_64",
        encoded({{"step", DType::kF64, {}}, {"mask", DType::kBool, {3}}}, {},
                64));
  Write("safetensors", "metadata_only",
        encoded({}, {{"format", "pt"}, {"note", "no tensors"}}, 8));
  Write("safetensors", "empty_object", SafetensorsFile("{}", ""));
  // Refused (one rule each).
  const std::string t = R"("a":{"dtype":"F32","shape":[2],"data_offsets":)";
  Write("safetensors", "length_past_end",
        SafetensorsFile("{}", "").replace(0, 1, "\x40", 1));
  Write("safetensors", "length_over_limit",
        SafetensorsFile("{}", "").replace(0, 4, "\xff\xff\xff\xff", 4));
  Write("safetensors", "duplicate_key",
        SafetensorsFile("{" + t + "[0,8]}," + t + "[0,8]}}", DataBytes(8)));
  Write("safetensors", "gap_between_tensors",
        SafetensorsFile("{" + t + "[4,12]}}", DataBytes(12)));
  Write("safetensors", "size_mismatch",
        SafetensorsFile("{" + t + "[0,6]}}", DataBytes(6)));
  Write("safetensors", "trailing_data",
        SafetensorsFile("{" + t + "[0,8]}}", DataBytes(9)));
  Write("safetensors", "shape_overflow",
        SafetensorsFile(R"({"a":{"dtype":"F32","shape":[4611686018427387904,)"
                        R"(8],"data_offsets":[0,0]}})",
                        ""));
  Write("safetensors", "invalid_utf8_name",
        SafetensorsFile("{\"\xc3\x28\":{\"dtype\":\"U8\",\"shape\":[1],"
                        "\"data_offsets\":[0,1]}}",
                        DataBytes(1)));
  Write("safetensors", "dtype_dcp_lacks",
        SafetensorsFile(R"({"a":{"dtype":"F8_E8M0","shape":[1],)"
                        R"("data_offsets":[0,1]}})",
                        DataBytes(1)));
}

void WriteResultsSeeds() {
  WriteResult tensor;
  tensor.index = MetadataIndex("model.w", Shape{4, 0}, 1);
  tensor.size_in_bytes = 4096;
  tensor.storage_data.relative_path = "__0_0123456789abcdef_0.distcp";
  tensor.storage_data.offset = 8192;
  tensor.storage_data.length = 4096;
  tensor.storage_data.block_checksums = {1, 0xffffffffffffffffULL};
  WriteResult value;
  value.index = MetadataIndex("step");
  value.size_in_bytes = 8;
  value.storage_data.relative_path = "__0_0123456789abcdef_0.distcp";
  value.storage_data.length = 8;
  Write("write_results", "tensor_and_value",
        internal::EncodeWriteResults({tensor, value}));
  Write("write_results", "none", internal::EncodeWriteResults({}));
  // Accepted here (the reader checks paths and ranges against the files).
  WriteResult far = tensor;
  far.storage_data.offset = std::numeric_limits<int64_t>::max();
  Write("write_results", "offset_int64_max",
        internal::EncodeWriteResults({far}));
  WriteResult outside = value;
  outside.storage_data.relative_path = "../outside.distcp";
  Write("write_results", "path_outside_directory",
        internal::EncodeWriteResults({outside}));
  // Refused (one rule each).
  WriteResult negative = value;
  negative.storage_data.length = -1;
  Write("write_results", "negative_length",
        internal::EncodeWriteResults({negative}));
  Write("write_results", "version_2", std::string("\x08\x02", 2));
  Write("write_results", "garbage", std::string("\xff\xff\xff\xff\x0f", 5));
}

// A MEGA header seed: the file size (8 bytes, little-endian), then the
// preamble and JSON without the zero padding up to the data section.
std::string MegaHeaderSeed(const MegaHeader& header, int64_t file_size) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(static_cast<uint64_t>(file_size) >> (8 * i));
  }
  std::string encoded = EncodeMegaHeader(header);
  uint64_t json_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    json_bytes = (json_bytes << 8) | static_cast<uint8_t>(encoded[16 + i]);
  }
  encoded.resize(kMegaPreambleBytes + json_bytes);
  return out + encoded;
}

MegaEntry MegaTensor(const std::string& name, DType dtype, Shape shape,
                     Shape offsets, Shape sizes, int64_t length) {
  MegaEntry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.offsets = std::move(offsets);
  e.sizes = std::move(sizes);
  e.length = length;
  return e;
}

// Fills each entry's checksums (one per block, arbitrary values).
void FillChecksums(MegaHeader& header) {
  for (MegaEntry& e : header.entries) {
    const int64_t blocks = (e.length + header.checksum_block_size - 1) /
                           header.checksum_block_size;
    e.checksums.assign(static_cast<size_t>(blocks), 0x0123456789abcdefULL);
  }
}

void MegaSeeds() {
  MegaHeader header;
  header.checksum_block_size = 4096;
  header.entries.push_back(
      MegaTensor("model.w", DType::kF32, {4, 3}, {0, 0}, {4, 3}, 4 * 3 * 4));
  header.entries.push_back(
      MegaTensor("model.big", DType::kBF16, {4096}, {2048}, {2048}, 4096));
  MegaEntry value;
  value.name = "step";
  value.is_tensor = false;
  value.length = 9;
  header.entries.push_back(value);
  header.entries.push_back(
      MegaTensor("empty", DType::kI64, {0, 5}, {0, 0}, {0, 5}, 0));
  OkOrDie(LayOutMegaFile(header));
  FillChecksums(header);
  Write("mega_header", "tensors_value_and_empty",
        MegaHeaderSeed(header, header.file_size));
  MegaHeader none;
  OkOrDie(LayOutMegaFile(none));
  Write("mega_header", "no_entries", MegaHeaderSeed(none, none.file_size));
  // Refused (one rule each).
  Write("mega_header", "truncated",
        MegaHeaderSeed(header, header.file_size - 1));
  Write("mega_header", "trailing_bytes",
        MegaHeaderSeed(header, header.file_size + 4096));
  std::string short_prefix = MegaHeaderSeed(header, header.file_size);
  Write("mega_header", "prefix_shorter_than_header",
        short_prefix.substr(0, 8 + kMegaPreambleBytes + 10));
  std::string bad_magic = short_prefix;
  bad_magic[8 + 1] = 'm';
  Write("mega_header", "bad_magic", bad_magic);
  std::string major_2 = short_prefix;
  major_2[8 + 8] = 2;
  Write("mega_header", "major_version_2", major_2);
  std::string flipped = short_prefix;
  flipped.back() ^= 1;
  Write("mega_header", "checksum_mismatch", flipped);
  MegaHeader overlap = header;
  overlap.entries[1].begin = overlap.entries[0].begin;
  Write("mega_header", "overlapping_entries",
        MegaHeaderSeed(overlap, overlap.file_size));
  MegaHeader outside = header;
  outside.entries[0].offsets = Shape{3, 0};
  Write("mega_header", "chunk_outside_tensor",
        MegaHeaderSeed(outside, outside.file_size));
  MegaHeader length = header;
  length.entries[0].length = 44;
  Write("mega_header", "length_not_shape",
        MegaHeaderSeed(length, length.file_size));
  MegaHeader block = header;
  block.checksum_block_size = 4095;
  Write("mega_header", "block_size_unaligned",
        MegaHeaderSeed(block, block.file_size));

  MegaIndex index;
  index.total_size = 4096 + 48 + 9;
  index.files = {MegaFileName(1, 2), MegaFileName(2, 2)};
  index.weight_map = {{"model.w", {MegaFileName(1, 2)}},
                      {"model.big", {MegaFileName(1, 2), MegaFileName(2, 2)}},
                      {"step", {MegaFileName(2, 2)}}};
  Write("mega_index", "two_files", EncodeMegaIndex(index));
  Write("mega_index", "empty", EncodeMegaIndex(MegaIndex{}));
  // Refused (one rule each).
  MegaIndex unlisted = index;
  unlisted.weight_map["extra"] = {MegaFileName(3, 3)};
  Write("mega_index", "maps_to_unlisted_file", EncodeMegaIndex(unlisted));
  MegaIndex traversal = index;
  traversal.files.push_back("../model.mega");
  Write("mega_index", "path_outside_directory", EncodeMegaIndex(traversal));
  MegaIndex itself = index;
  itself.files.push_back(kMegaIndexFileName);
  Write("mega_index", "lists_the_index", EncodeMegaIndex(itself));
  MegaIndex no_files = index;
  no_files.weight_map["none"] = {};
  Write("mega_index", "value_without_files", EncodeMegaIndex(no_files));
  Write("mega_index", "major_version_2",
        R"({"format": "mega", "version": [2, 0], "files": [], )"
        R"("weight_map": {}})");
  Write("mega_index", "not_json", "{\"format\": \"mega\", ");

  internal_io::CommitJournal journal;
  journal.renames = {
      {".model-00001-of-00002.mega.tmp-0123456789abcdef", MegaFileName(1, 2)},
      {".model.mega.index.json.tmp-fedcba9876543210", kMegaIndexFileName}};
  journal.removals = {kMegaSingleFileName};
  Write("commit_journal", "renames_and_removal",
        internal_io::EncodeCommitJournal(journal));
  Write("commit_journal", "empty",
        internal_io::EncodeCommitJournal(internal_io::CommitJournal{}));
  // Refused (one rule each).
  internal_io::CommitJournal up = journal;
  up.removals = {"../model.mega"};
  Write("commit_journal", "removal_outside_directory",
        internal_io::EncodeCommitJournal(up));
  internal_io::CommitJournal absolute = journal;
  absolute.removals = {"/etc/passwd"};
  Write("commit_journal", "removal_absolute",
        internal_io::EncodeCommitJournal(absolute));
  internal_io::CommitJournal not_temporary = journal;
  not_temporary.renames[0].first = "model-00002-of-00002.mega";
  Write("commit_journal", "rename_from_checkpoint_file",
        internal_io::EncodeCommitJournal(not_temporary));
  internal_io::CommitJournal moved = journal;
  moved.renames[0].first = "sub/.model.mega.tmp-0123456789abcdef";
  Write("commit_journal", "rename_across_directories",
        internal_io::EncodeCommitJournal(moved));
  Write("commit_journal", "rename_of_three",
        R"({"renames": [["a", "b", "c"]], "removals": []})");
  Write("commit_journal", "not_json", "{\"renames\": [");
}

}  // namespace
}  // namespace dcp::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  dcp::fuzz::root = argv[1];
  dcp::fuzz::MetadataSeeds();
  dcp::fuzz::PlanCodecSeeds();
  dcp::fuzz::ValueCodecSeeds();
  dcp::fuzz::SafetensorsSeeds();
  dcp::fuzz::WriteResultsSeeds();
  dcp::fuzz::MegaSeeds();
  return 0;
}
