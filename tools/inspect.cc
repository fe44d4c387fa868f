// `dcp inspect DIR` and `dcp verify DIR`.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checksum.h"
#include "core/status.h"
#include "io/file_system_storage.h"
#include "tools/commands.h"

namespace dcp {
namespace {

absl::StatusOr<Metadata> ReadCommittedMetadata(const std::string& dir) {
  FileSystemReader reader(dir);
  DCP_RETURN_IF_ERROR(reader.Reset(dir));
  return reader.ReadMetadata();
}

std::string ChunkToString(const ChunkStorageMetadata& chunk) {
  return absl::StrCat("offsets ", ShapeToString(chunk.offsets), " sizes ",
                      ShapeToString(chunk.sizes));
}

// Reads `length` bytes at `offset` of `fd`; kDataLoss when the file ends
// early.
absl::Status ReadFully(int fd, const std::string& path, int64_t offset,
                       std::string& out) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done,
                        offset + static_cast<int64_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return ErrnoError(
          errno, absl::StrCat("pread ", path, " offset=", offset + done));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(
          path, " is truncated: wanted ", out.size(), " bytes at offset ",
          offset, ", file ends after ", done));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunInspect(const std::string& dir) {
  DCP_ASSIGN_OR_RETURN(Metadata metadata, ReadCommittedMetadata(dir));
  std::printf("checkpoint %s (format %s, checksum block %lld bytes)\n",
              dir.c_str(), metadata.version.c_str(),
              static_cast<long long>(metadata.checksum_block_size));
  if (metadata.storage_meta.has_value()) {
    std::printf("save id %s\n", metadata.storage_meta->save_id.c_str());
  }
  std::map<std::string, int64_t> file_bytes;
  for (const auto& [index, info] : metadata.storage_data) {
    file_bytes[info.relative_path] += info.length;
  }
  std::printf("\n%-48s %-6s %-20s %s\n", "key", "dtype", "shape", "chunks");
  for (const auto& [name, entry] : metadata.state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      std::printf("%-48s %-6s %-20s %zu\n", name.c_str(),
                  std::string(DTypeName(t->properties.dtype)).c_str(),
                  ShapeToString(t->size).c_str(), t->chunks.size());
      if (t->chunks.size() > 1) {
        for (const ChunkStorageMetadata& chunk : t->chunks) {
          std::printf("    %s\n", ChunkToString(chunk).c_str());
        }
      }
    } else {
      std::printf("%-48s %-6s %-20s\n", name.c_str(), "bytes", "-");
    }
  }
  std::printf("\n%-40s %s\n", "file", "bytes of items");
  for (const auto& [file, bytes] : file_bytes) {
    std::printf("%-40s %lld\n", file.c_str(), static_cast<long long>(bytes));
  }
  return absl::OkStatus();
}

absl::Status RunVerify(const std::string& dir) {
  DCP_ASSIGN_OR_RETURN(Metadata metadata, ReadCommittedMetadata(dir));
  const int64_t block = metadata.checksum_block_size;
  std::vector<std::string> problems;
  int64_t items = 0, bytes = 0;
  std::string buffer;
  for (const auto& [index, info] : metadata.storage_data) {
    ++items;
    const std::string path = absl::StrCat(dir, "/", info.relative_path);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      problems.push_back(
          ErrnoError(errno, absl::StrCat("open ", path)).ToString());
      continue;
    }
    const int64_t expected_blocks =
        block > 0 ? (info.length + block - 1) / block : 0;
    if (static_cast<int64_t>(info.block_checksums.size()) != expected_blocks) {
      problems.push_back(absl::StrCat(
          index.ToString(), ": metadata has ", info.block_checksums.size(),
          " block checksums, expected ", expected_blocks));
    }
    for (int64_t b = 0; b < expected_blocks &&
                        b < static_cast<int64_t>(info.block_checksums.size());
         ++b) {
      const int64_t start = b * block;
      buffer.resize(std::min(block, info.length - start));
      absl::Status read = ReadFully(fd, path, info.offset + start, buffer);
      if (!read.ok()) {
        problems.push_back(
            absl::StrCat(index.ToString(), ": ", read.message()));
        break;
      }
      bytes += static_cast<int64_t>(buffer.size());
      if (Checksum(buffer.data(), buffer.size()) != info.block_checksums[b]) {
        problems.push_back(
            absl::StrCat(index.ToString(), ": checksum mismatch in ",
                         info.relative_path, " at offset ", info.offset + start,
                         " (block ", b, ", ", buffer.size(), " bytes)"));
      }
    }
    ::close(fd);
  }
  for (const std::string& p : problems) std::printf("BAD  %s\n", p.c_str());
  std::printf("%s: %lld items, %lld bytes checked, %zu problems\n",
              problems.empty() ? "OK" : "CORRUPT",
              static_cast<long long>(items), static_cast<long long>(bytes),
              problems.size());
  if (!problems.empty()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", dir, " failed verification: ", problems.front(),
        problems.size() > 1
            ? absl::StrCat(" (and ", problems.size() - 1, " more)")
            : ""));
  }
  return absl::OkStatus();
}

}  // namespace dcp
