#include "io/internal/read_drop_behind.h"

#include <algorithm>
#include <iterator>

namespace dcp {

std::pair<int64_t, int64_t> ReadDropBehind::Insert(
    std::map<int64_t, int64_t>& set, int64_t begin, int64_t end) {
  auto it = set.upper_bound(begin);
  if (it != set.begin()) {
    auto before = std::prev(it);
    if (before->second >= begin) {
      begin = before->first;
      end = std::max(end, before->second);
      it = set.erase(before);
    }
  }
  while (it != set.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = set.erase(it);
  }
  set.emplace(begin, end);
  return {begin, end};
}

ReadDropBehind::Ranges ReadDropBehind::TakeUndropped(int64_t begin,
                                                     int64_t end) {
  Ranges out;
  int64_t at = begin;
  auto it = dropped_.upper_bound(begin);
  if (it != dropped_.begin()) --it;
  for (; it != dropped_.end() && it->first < end && at < end; ++it) {
    if (it->second <= at) continue;
    if (it->first > at) out.emplace_back(at, it->first);
    at = std::max(at, it->second);
  }
  if (at < end) out.emplace_back(at, end);
  for (const auto& [b, e] : out) Insert(dropped_, b, e);
  return out;
}

ReadDropBehind::Ranges ReadDropBehind::Done(int64_t offset, int64_t length) {
  if (length <= 0) return {};
  absl::MutexLock lock(&mu_);
  const auto [begin, end] = Insert(read_, offset, offset + length);
  // Whole aligned stretches only: the bytes next to a run's ends may share
  // a folio with a read still out.
  const int64_t from = (begin + align_ - 1) / align_ * align_;
  const int64_t to = end / align_ * align_;
  if (from >= to) return {};
  return TakeUndropped(from, to);
}

ReadDropBehind::Ranges ReadDropBehind::Rest() {
  absl::MutexLock lock(&mu_);
  Ranges out;
  const std::map<int64_t, int64_t> runs = read_;
  for (const auto& [begin, end] : runs) {
    Ranges part = TakeUndropped(begin, end);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

}  // namespace dcp
