// `dcp inspect DIR` and `dcp verify DIR` for Hugging Face directories
// (docs/FORMAT.md section 7): tools/commands.h.
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "io/file_system.h"
#include "io/hf_quantized_storage.h"
#include "io/hf_storage.h"
#include "io/metadata_format.h"
#include "io/safetensors.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace dcp {
namespace {

using Json = nlohmann::json;

absl::StatusOr<std::unique_ptr<File>> OpenNoFollow(const std::string& path) {
  OpenOptions options;
  options.exclusive = false;
  options.no_follow = true;
  return LocalFileSystem().OpenForRead(path, options);
}

// A file of a Hugging Face checkpoint, following a symbolic link as the
// readers do (a hub cache snapshot links its files into ../../blobs/);
// never a FIFO or device.
absl::StatusOr<std::unique_ptr<File>> OpenHfFile(const std::string& path) {
  OpenOptions options;
  options.exclusive = false;
  return LocalFileSystem().OpenForRead(path, options);
}

// The index's JSON, or null when there is none (or it does not parse:
// ResolveHfCheckpointFiles reports that).
Json ReadIndex(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<File>> file =
      OpenHfFile(JoinPath(dir, kHfIndexFileName));
  if (!file.ok()) return nullptr;
  absl::StatusOr<int64_t> size = (*file)->Size();
  if (!size.ok() || *size > kHfMaxIndexBytes) return nullptr;
  std::string text(*size, '\0');
  absl::StatusOr<size_t> got = (*file)->PRead(
      0, {reinterpret_cast<std::byte*>(text.data()), text.size()});
  if (!got.ok()) return nullptr;
  text.resize(*got);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

struct HfFile {
  std::string name;
  int64_t size = 0;
  SafetensorsHeader header;
};

// Reads and validates every file's header; problems collected, not fatal.
std::vector<HfFile> ReadHeaders(const std::string& dir,
                                const std::vector<std::string>& names,
                                std::vector<std::string>& problems) {
  std::vector<HfFile> files;
  for (const std::string& name : names) {
    absl::StatusOr<std::unique_ptr<File>> file =
        OpenHfFile(JoinPath(dir, name));
    absl::StatusOr<SafetensorsHeader> header =
        file.ok() ? ReadSafetensorsHeader(**file)
                  : absl::StatusOr<SafetensorsHeader>(file.status());
    if (!header.ok()) {
      problems.push_back(absl::StrCat(name, ": ", header.status().message()));
      continue;
    }
    files.push_back(
        {name, header->data_start() + header->data_length, *std::move(header)});
  }
  return files;
}

int64_t TensorBytes(const std::vector<HfFile>& files) {
  int64_t total = 0;
  for (const HfFile& f : files) {
    for (const SafetensorsTensor& t : f.header.tensors) {
      total += t.end - t.begin;
    }
  }
  return total;
}

}  // namespace

bool IsHfCheckpointDirectory(const std::string& dir) {
  FileSystemBase& fs = LocalFileSystem();
  if (OpenNoFollow(JoinPath(dir, kMetadataFileName)).ok()) return false;
  return ResolveHfCheckpointFiles(fs, dir).ok();
}

absl::Status RunInspectHf(const std::string& dir) {
  std::map<std::string, std::string> weight_map;
  DCP_ASSIGN_OR_RETURN(
      std::vector<std::string> names,
      ResolveHfCheckpointFiles(LocalFileSystem(), dir, &weight_map));
  std::vector<std::string> problems;
  const std::vector<HfFile> files = ReadHeaders(dir, names, problems);
  if (!problems.empty()) {
    return absl::DataLossError(
        absl::StrCat("Hugging Face checkpoint ", dir, ": ", problems.front()));
  }
  std::printf(
      "Hugging Face checkpoint %s (%zu safetensors files%s)\n", dir.c_str(),
      files.size(),
      weight_map.empty() ? "" : absl::StrCat(", ", kHfIndexFileName).c_str());
  std::set<std::string> all;
  for (const HfFile& f : files) {
    for (const SafetensorsTensor& t : f.header.tensors) all.insert(t.name);
  }
  int quantized = 0;
  std::printf("\n%-48s %-8s %-20s %s\n", "tensor", "dtype", "shape", "file");
  for (const HfFile& f : files) {
    for (const SafetensorsTensor& t : f.header.tensors) {
      const bool scaled =
          t.dtype == DType::kF8E4M3 && all.count(t.name + kHfScaleSuffix) != 0;
      quantized += scaled ? 1 : 0;
      std::printf("%-48s %-8s %-20s %s%s\n", t.name.c_str(),
                  std::string(DTypeName(t.dtype)).c_str(),
                  ShapeToString(t.shape).c_str(), f.name.c_str(),
                  scaled ? "  (block-scaled fp8)" : "");
    }
  }
  std::printf("\n%-48s %-12s %s\n", "file", "tensors", "bytes");
  int64_t file_total = 0;
  for (const HfFile& f : files) {
    std::printf("%-48s %-12zu %lld\n", f.name.c_str(), f.header.tensors.size(),
                static_cast<long long>(f.size));
    file_total += f.size;
  }
  std::printf("\n%zu tensors, %lld bytes of tensors, %lld bytes in files",
              all.size(), static_cast<long long>(TensorBytes(files)),
              static_cast<long long>(file_total));
  if (quantized > 0) {
    std::printf(", %d fp8 tensors with %s block scales", quantized,
                kHfScaleSuffix);
  }
  std::printf("\n");
  return absl::OkStatus();
}

absl::Status RunVerifyHf(const std::string& dir) {
  std::map<std::string, std::string> weight_map;
  DCP_ASSIGN_OR_RETURN(
      std::vector<std::string> names,
      ResolveHfCheckpointFiles(LocalFileSystem(), dir, &weight_map));
  std::vector<std::string> problems, notes;
  const std::vector<HfFile> files = ReadHeaders(dir, names, problems);
  std::map<std::string, std::set<std::string>> tensors_of;
  size_t tensor_count = 0;
  for (const HfFile& f : files) {
    for (const SafetensorsTensor& t : f.header.tensors) {
      tensors_of[f.name].insert(t.name);
      ++tensor_count;
      // Loads (dcp's, PyTorch's, transformers') read every tensor of the
      // files they open, so one the index forgets still loads: a note.
      if (!weight_map.empty() && weight_map.count(t.name) == 0) {
        notes.push_back(absl::StrCat(f.name, " holds ", t.name, ", which ",
                                     kHfIndexFileName,
                                     " does not name (loads still read it)"));
      }
    }
  }
  std::set<std::string> read;
  for (const HfFile& f : files) read.insert(f.name);
  for (const auto& [tensor, file] : weight_map) {
    if (read.count(file) == 0) continue;  // Its file's problem is listed.
    if (tensors_of[file].count(tensor) == 0) {
      problems.push_back(absl::StrCat(kHfIndexFileName, " maps ", tensor,
                                      " to ", file,
                                      ", which does not hold it"));
    }
  }
  if (!weight_map.empty()) {
    const Json index = ReadIndex(dir);
    const int64_t bytes = TensorBytes(files);
    if (index.is_object() && index.contains("metadata") &&
        index["metadata"].is_object() &&
        index["metadata"].contains("total_size") &&
        index["metadata"]["total_size"].is_number_integer() &&
        index["metadata"]["total_size"].get<int64_t>() != bytes) {
      notes.push_back(
          absl::StrCat(kHfIndexFileName, " gives total_size ",
                       index["metadata"]["total_size"].get<int64_t>(),
                       "; the tensors take ", bytes, " bytes"));
    }
  }
  if (problems.empty()) {
    // Across files: chunks of one tensor, sharding information, dtypes.
    HuggingFaceStorageReader reader(dir);
    absl::Status metadata = reader.ReadMetadata().status();
    if (!metadata.ok()) problems.push_back(std::string(metadata.message()));
  }
  for (const std::string& n : notes) std::printf("NOTE %s\n", n.c_str());
  for (const std::string& p : problems) std::printf("BAD  %s\n", p.c_str());
  std::printf(
      "%s: %zu files, %zu tensors checked against the safetensors "
      "rules%s, %zu problems\n",
      problems.empty() ? "OK" : "CORRUPT", names.size(), tensor_count,
      weight_map.empty() ? "" : " and the index", problems.size());
  if (!problems.empty()) {
    return absl::DataLossError(
        absl::StrCat("Hugging Face checkpoint ", dir,
                     " failed verification: ", problems.front(),
                     problems.size() > 1
                         ? absl::StrCat(" (and ", problems.size() - 1, " more)")
                         : ""));
  }
  return absl::OkStatus();
}

}  // namespace dcp
