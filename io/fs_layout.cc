#include "io/fs_layout.h"

#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "io/file_system.h"
#include "io/internal/parallel_work.h"

namespace dcp::internal_fs {
namespace {

using internal_io::AlignUp;
using internal_io::kDirectIoAlignment;

bool IsDecimal(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
}

}  // namespace

std::string NewSaveId() {
  uint64_t bits = 0;
  if (::getrandom(&bits, sizeof(bits), 0) != sizeof(bits)) {
    bits = static_cast<uint64_t>(
               std::chrono::steady_clock::now().time_since_epoch().count()) ^
           reinterpret_cast<uintptr_t>(&bits);
  }
  return absl::StrFormat("%016x", bits);
}

std::string DataFilePrefix(int rank, absl::string_view save_id) {
  return absl::StrCat("__", rank, "_", save_id, "_");
}

std::string DataFileName(absl::string_view prefix, size_t index) {
  return absl::StrCat(prefix, index, kDataFileSuffix);
}

std::string TempMetadataFileName(absl::string_view save_id) {
  return absl::StrCat(kTempMetadataPrefix, save_id);
}

absl::string_view SaveIdOfDataFilePrefix(absl::string_view prefix) {
  if (!absl::ConsumePrefix(&prefix, "__") ||
      !absl::ConsumeSuffix(&prefix, "_")) {
    return {};
  }
  const size_t cut = prefix.find('_');
  if (cut == absl::string_view::npos || !IsDecimal(prefix.substr(0, cut)) ||
      !IsSaveId(prefix.substr(cut + 1))) {
    return {};
  }
  return prefix.substr(cut + 1);
}

std::string SaveMarkerFileName(absl::string_view save_id) {
  return absl::StrCat(kProbeFilePrefix, "save-", save_id);
}

bool IsSaveId(absl::string_view text) {
  return text.size() == 16 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool IsDataFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "__") ||
      !absl::ConsumeSuffix(&name, kDataFileSuffix)) {
    return false;
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(name, '_');
  return parts.size() == 3 && IsDecimal(parts[0]) && IsSaveId(parts[1]) &&
         IsDecimal(parts[2]);
}

bool IsTempMetadataFileName(absl::string_view name) {
  return absl::ConsumePrefix(&name, kTempMetadataPrefix) && IsSaveId(name);
}

std::vector<std::vector<size_t>> AssignItemsToFiles(
    absl::Span<const int64_t> sizes, int thread_count,
    bool single_file_per_rank) {
  std::vector<std::vector<size_t>> files;
  if (sizes.empty()) return files;
  if (!single_file_per_rank) {
    files.resize(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) files[i].push_back(i);
    return files;
  }
  const size_t count =
      std::min<size_t>(std::max(1, thread_count), sizes.size());
  files.resize(count);
  std::vector<int64_t> bytes(count, 0);
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  for (size_t i : order) {
    const size_t best = static_cast<size_t>(
        std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
    bytes[best] += sizes[i];
    files[best].push_back(i);
  }
  for (std::vector<size_t>& file : files) {
    std::sort(file.begin(), file.end());  // Plan order.
  }
  return files;
}

FileLayout LayOutFile(absl::Span<const LayoutItem> items, bool direct_io) {
  FileLayout layout;
  layout.offset.resize(items.size());
  layout.pack.assign(items.size(), -1);
  int64_t end = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const LayoutItem& item = items[i];
    if (!item.on_device && item.length > 0 && item.length <= kPackItemBytes) {
      // A pack stays open while items are packed back to back.
      const bool open = i > 0 && layout.pack[i - 1] >= 0;
      int64_t at =
          open ? AlignUp(layout.packs.back().used, kPackAlignment) : kPackBytes;
      if (at + item.length > kPackBytes) {
        layout.packs.push_back({AlignUp(end, kDirectIoAlignment), 0, i});
        at = 0;
      }
      layout.pack[i] = static_cast<int>(layout.packs.size() - 1);
      layout.offset[i] = layout.packs.back().start + at;
      layout.packs.back().used = at + item.length;
      end = layout.offset[i] + item.length;
      continue;
    }
    layout.offset[i] =
        item.tensor || direct_io ? AlignUp(end, kDirectIoAlignment) : end;
    end = layout.offset[i] + item.length;
  }
  layout.end = direct_io ? AlignUp(end, kDirectIoAlignment) : end;
  return layout;
}

}  // namespace dcp::internal_fs
