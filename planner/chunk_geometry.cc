#include "planner/chunk_geometry.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace dcp {
namespace {

// Above this rank the corner test (2^rank corners per chunk) gives way to
// the sweep, and above this many corner coordinates (8 bytes each, about
// 2^20 chunks of rank 2; 800 of rank 10) too, so that a small metadata
// file cannot make the test allocate gigabytes.
constexpr size_t kMaxCornerRank = 10;
constexpr size_t kMaxCornerCoordinates = size_t{1} << 23;

bool IsEmpty(const ChunkStorageMetadata& c) {
  for (int64_t s : c.sizes) {
    if (s == 0) return true;
  }
  return false;
}

// Picks the dimension along which `chunks` start at the most distinct
// offsets: sweeping along it keeps the active sets small.
size_t SweepDimension(absl::Span<const ChunkStorageMetadata> chunks,
                      size_t rank) {
  if (chunks.size() <= 1 || rank <= 1) return 0;
  // Cheap first: when offsets vary along one dimension only, sweep along it.
  size_t varying = 0;
  size_t last_varying = 0;
  for (size_t d = 0; d < rank; ++d) {
    for (const ChunkStorageMetadata& c : chunks) {
      if (c.offsets[d] != chunks[0].offsets[d]) {
        ++varying;
        last_varying = d;
        break;
      }
    }
  }
  if (varying <= 1) return last_varying;
  size_t best = 0;
  size_t best_count = 0;
  std::vector<int64_t> starts(chunks.size());
  for (size_t d = 0; d < rank; ++d) {
    for (size_t i = 0; i < chunks.size(); ++i) {
      starts[i] = chunks[i].offsets[d];
    }
    std::sort(starts.begin(), starts.end());
    const size_t count = static_cast<size_t>(
        std::unique(starts.begin(), starts.end()) - starts.begin());
    if (count > best_count) {
      best = d;
      best_count = count;
    }
  }
  return best;
}

// True when no chunk is empty and, in the given order, each chunk starts
// along `dim` where the previous one ends or later: then starts and ends are
// both sorted and a binary search finds the chunks meeting any interval.
bool SortedDisjointAlong(absl::Span<const ChunkStorageMetadata> chunks,
                         size_t dim) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (IsEmpty(chunks[i])) return false;
    if (i > 0 && chunks[i].offsets[dim] <
                     chunks[i - 1].offsets[dim] + chunks[i - 1].sizes[dim]) {
      return false;
    }
  }
  return true;
}

// Non-empty chunks, sorted by their start along `dim`.
std::vector<size_t> SortedNonEmpty(
    absl::Span<const ChunkStorageMetadata> chunks, size_t dim) {
  std::vector<size_t> order;
  order.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!IsEmpty(chunks[i])) order.push_back(i);
  }
  auto less = [&](size_t a, size_t b) {
    const int64_t sa = chunks[a].offsets[dim];
    const int64_t sb = chunks[b].offsets[dim];
    return sa != sb ? sa < sb : a < b;
  };
  // Metadata keeps chunks sorted: skip the sort then.
  if (!std::is_sorted(order.begin(), order.end(), less)) {
    std::sort(order.begin(), order.end(), less);
  }
  return order;
}

// Removes from `active` the chunks that end at or before `position` along
// `dim`.
void Retire(std::vector<size_t>& active,
            absl::Span<const ChunkStorageMetadata> chunks, size_t dim,
            int64_t position) {
  size_t kept = 0;
  for (size_t i : active) {
    if (chunks[i].offsets[dim] + chunks[i].sizes[dim] > position) {
      active[kept++] = i;
    }
  }
  active.resize(kept);
}

// The first pair of distinct chunks that share an element, if any.
std::optional<std::pair<size_t, size_t>> FindSelfOverlap(
    absl::Span<const ChunkStorageMetadata> chunks, size_t rank) {
  const size_t dim = SweepDimension(chunks, rank);
  std::vector<size_t> active;
  for (size_t i : SortedNonEmpty(chunks, dim)) {
    if (rank == 0) {
      if (!active.empty()) return std::make_pair(active[0], i);
      active.push_back(i);
      continue;
    }
    Retire(active, chunks, dim, chunks[i].offsets[dim]);
    for (size_t j : active) {
      if (IntersectChunks(chunks[i], chunks[j]).has_value()) {
        return std::make_pair(j, i);
      }
    }
    active.push_back(i);
  }
  return std::nullopt;
}

// Exact tiling test by signed corner counts. For a box B = prod [a_j, b_j),
// the discrete mixed difference of its indicator is a signed sum over its
// 2^rank corners (sign (-1)^(number of upper bounds)). The difference
// operator is injective on finitely supported functions, so the chunks
// cover the tensor exactly once iff their corner sums equal the tensor's.
bool CornersMatch(const Shape& global_size,
                  absl::Span<const ChunkStorageMetadata> chunks,
                  absl::Span<const size_t> nonempty) {
  const size_t rank = global_size.size();
  const size_t per_box = size_t{1} << rank;
  const size_t count = (nonempty.size() + 1) * per_box;
  std::vector<int64_t> coords(count * rank);
  std::vector<int8_t> signs(count);
  size_t next = 0;
  auto add_box = [&](const Shape& offsets, const Shape& sizes, int8_t sign) {
    for (size_t mask = 0; mask < per_box; ++mask) {
      // data() + offset, not &coords[...]: for a scalar (rank 0) coords is
      // empty and operator[] on it is undefined (UBSan: reference binding
      // to null pointer).
      int64_t* c = coords.data() + next * rank;
      int parity = 0;
      for (size_t d = 0; d < rank; ++d) {
        const bool upper = (mask >> d) & 1;
        c[d] = offsets[d] + (upper ? sizes[d] : 0);
        parity ^= upper ? 1 : 0;
      }
      signs[next++] = parity ? -sign : sign;
    }
  };
  for (size_t i : nonempty) add_box(chunks[i].offsets, chunks[i].sizes, 1);
  add_box(Shape(rank, 0), global_size, -1);
  std::vector<uint32_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  auto less = [&](uint32_t a, uint32_t b) {
    const int64_t* ca = coords.data() + a * rank;
    const int64_t* cb = coords.data() + b * rank;
    return std::lexicographical_compare(ca, ca + rank, cb, cb + rank);
  };
  std::sort(order.begin(), order.end(), less);
  for (size_t i = 0; i < count;) {
    int64_t sum = 0;
    size_t j = i;
    while (j < count && !less(order[i], order[j])) sum += signs[order[j++]];
    if (sum != 0) return false;
    i = j;
  }
  return true;
}

}  // namespace

std::string ChunkToString(const ChunkStorageMetadata& chunk) {
  return absl::StrCat("offsets ", ShapeToString(chunk.offsets), " sizes ",
                      ShapeToString(chunk.sizes));
}

int64_t ChunkVolume(const ChunkStorageMetadata& chunk) {
  return NumElements(chunk.sizes);
}

std::optional<ChunkStorageMetadata> IntersectChunks(
    const ChunkStorageMetadata& a, const ChunkStorageMetadata& b) {
  const size_t rank = a.offsets.size();
  ChunkStorageMetadata out;
  out.offsets.resize(rank);
  out.sizes.resize(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t start = std::max(a.offsets[d], b.offsets[d]);
    const int64_t end =
        std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (end <= start) return std::nullopt;
    out.offsets[d] = start;
    out.sizes[d] = end - start;
  }
  return out;
}

bool FindCoveringChunks(const ChunkStorageMetadata& requested,
                        absl::Span<const ChunkStorageMetadata> saved,
                        std::vector<ChunkOverlap>* out) {
  const int64_t volume = ChunkVolume(requested);
  if (volume == 0) return true;
  if (saved.empty()) return false;
  const size_t rank = requested.offsets.size();
  if (rank == 0) {
    // A scalar: one saved chunk holds it.
    if (saved.size() != 1 || !saved[0].offsets.empty()) return false;
    out->push_back({0, ChunkStorageMetadata{}});
    return true;
  }
  const ChunkStorageMetadata& first = saved.front();
  const ChunkStorageMetadata& last = saved.back();
  if (first.offsets.size() != rank || last.offsets.size() != rank) {
    return false;
  }
  size_t dim = 0;
  while (dim + 1 < rank && first.offsets[dim] == last.offsets[dim]) ++dim;
  const int64_t begin = requested.offsets[dim];
  const int64_t end = begin + requested.sizes[dim];
  // The first saved chunk that ends after `begin` along `dim`, when the
  // chunks are sorted and split along it; on another layout, some position
  // (the checks below then fail).
  size_t lo = 0;
  size_t hi = saved.size();
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    const ChunkStorageMetadata& c = saved[mid];
    if (c.offsets.size() != rank || c.sizes.size() != rank) return false;
    if (c.offsets[dim] + c.sizes[dim] <= begin) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const size_t mark = out->size();
  int64_t covered = 0;
  bool ok = true;
  for (size_t s = lo; s < saved.size(); ++s) {
    const ChunkStorageMetadata& c = saved[s];
    if (c.offsets.size() != rank || c.sizes.size() != rank) {
      ok = false;
      break;
    }
    if (c.offsets[dim] >= end) break;
    // Disjoint along `dim` from the previous candidate, hence from all.
    if (s > lo &&
        c.offsets[dim] < saved[s - 1].offsets[dim] + saved[s - 1].sizes[dim]) {
      ok = false;
      break;
    }
    if (std::optional<ChunkStorageMetadata> box =
            IntersectChunks(requested, c)) {
      covered += ChunkVolume(*box);
      out->push_back({s, *std::move(box)});
    }
  }
  if (ok && covered == volume) return true;
  out->resize(mark);
  return false;
}

void ForEachOverlap(
    absl::Span<const ChunkStorageMetadata> requested,
    absl::Span<const ChunkStorageMetadata> saved,
    absl::FunctionRef<void(size_t, size_t, const ChunkStorageMetadata&)>
        on_overlap) {
  if (requested.empty() || saved.empty()) return;
  const size_t rank = saved[0].offsets.size();
  if (rank == 0) {
    const ChunkStorageMetadata scalar;
    for (size_t i = 0; i < requested.size(); ++i) {
      for (size_t j = 0; j < saved.size(); ++j) on_overlap(i, j, scalar);
    }
    return;
  }
  // Metadata lists chunks sorted by offset: a split along the first
  // dimension passes the first test without computing a sweep dimension.
  size_t dim = 0;
  bool disjoint = SortedDisjointAlong(saved, 0);
  if (!disjoint) {
    dim = SweepDimension(saved, rank);
    disjoint = dim != 0 && SortedDisjointAlong(saved, dim);
  }
  if (disjoint) {
    // The common layout (saved chunks split along one dimension): binary
    // search, O(log m + answer) per requested chunk.
    for (size_t r = 0; r < requested.size(); ++r) {
      const ChunkStorageMetadata& want = requested[r];
      if (IsEmpty(want)) continue;
      const int64_t begin = want.offsets[dim];
      const int64_t end = begin + want.sizes[dim];
      size_t s =
          std::partition_point(saved.begin(), saved.end(),
                               [&](const ChunkStorageMetadata& c) {
                                 return c.offsets[dim] + c.sizes[dim] <= begin;
                               }) -
          saved.begin();
      for (; s < saved.size() && saved[s].offsets[dim] < end; ++s) {
        if (auto box = IntersectChunks(want, saved[s])) on_overlap(r, s, *box);
      }
    }
    return;
  }
  const std::vector<size_t> req_order = SortedNonEmpty(requested, dim);
  const std::vector<size_t> saved_order = SortedNonEmpty(saved, dim);
  // Merge the two sorted lists. A chunk entering the sweep is paired with
  // the other side's chunks still open at its start.
  struct Side {
    absl::Span<const ChunkStorageMetadata> chunks;
    const std::vector<size_t>& order;
    size_t next = 0;
    std::vector<size_t> active;
    bool done() const { return next == order.size(); }
    int64_t next_start(size_t d) const {
      return chunks[order[next]].offsets[d];
    }
  };
  Side req{requested, req_order};
  Side sav{saved, saved_order};
  while (!req.done() || !sav.done()) {
    const bool take_saved =
        req.done() ||
        (!sav.done() && sav.next_start(dim) <= req.next_start(dim));
    Side& self = take_saved ? sav : req;
    Side& other = take_saved ? req : sav;
    if (other.done() && other.active.empty()) break;
    const size_t i = self.order[self.next++];
    Retire(other.active, other.chunks, dim, self.chunks[i].offsets[dim]);
    for (size_t j : other.active) {
      const size_t r = take_saved ? j : i;
      const size_t s = take_saved ? i : j;
      if (auto box = IntersectChunks(requested[r], saved[s])) {
        on_overlap(r, s, *box);
      }
    }
    self.active.push_back(i);
  }
}

absl::Status ValidateTiling(absl::string_view tensor_name,
                            const Shape& global_size,
                            absl::Span<const ChunkStorageMetadata> chunks,
                            absl::FunctionRef<std::string(size_t)> describe,
                            bool require_full_coverage) {
  const size_t rank = global_size.size();
  std::vector<size_t> nonempty;
  nonempty.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkStorageMetadata& c = chunks[i];
    if (c.offsets.size() != rank || c.sizes.size() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", tensor_name, "\": chunk ", describe(i), " has rank ",
          c.sizes.size(), " but the tensor's shape is ",
          ShapeToString(global_size)));
    }
    for (size_t d = 0; d < rank; ++d) {
      if (c.offsets[d] < 0 || c.sizes[d] < 0 ||
          c.offsets[d] > global_size[d] - c.sizes[d]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", tensor_name, "\": chunk ", describe(i),
            " lies outside the tensor's shape ", ShapeToString(global_size)));
      }
    }
    if (!IsEmpty(c)) nonempty.push_back(i);
  }
  const int64_t total = NumElements(global_size);
  if (total == 0) return absl::OkStatus();  // In-bounds chunks are empty.
  auto overlap_error = [&](size_t a, size_t b) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", tensor_name, "\": chunks ", describe(a), " and ",
        describe(b), " overlap; each element must be saved by one chunk"));
  };
  if (!require_full_coverage) {
    if (auto pair = FindSelfOverlap(chunks, rank)) {
      return overlap_error(pair->first, pair->second);
    }
    return absl::OkStatus();
  }
  // Dimensions along which some chunk does not span the whole tensor.
  std::vector<size_t> split_dims;
  for (size_t d = 0; d < rank; ++d) {
    for (size_t i : nonempty) {
      if (chunks[i].offsets[d] != 0 || chunks[i].sizes[d] != global_size[d]) {
        split_dims.push_back(d);
        break;
      }
    }
  }
  if (split_dims.size() <= 1 && !nonempty.empty()) {
    if (split_dims.empty()) {
      if (nonempty.size() > 1) return overlap_error(nonempty[0], nonempty[1]);
      return absl::OkStatus();
    }
    // Chunks along one dimension: sort and walk.
    const size_t dim = split_dims[0];
    const std::vector<size_t> order = SortedNonEmpty(chunks, dim);
    // Overlaps are reported before gaps.
    int64_t covered_to = 0;
    size_t reaching = 0;  // The chunk that ends at covered_to.
    std::optional<int64_t> gap;
    for (size_t i : order) {
      const ChunkStorageMetadata& c = chunks[i];
      if (c.offsets[dim] < covered_to) return overlap_error(reaching, i);
      if (c.offsets[dim] > covered_to && !gap.has_value()) gap = covered_to;
      covered_to = c.offsets[dim] + c.sizes[dim];
      reaching = i;
    }
    if (!gap.has_value() && covered_to != global_size[dim]) gap = covered_to;
    if (!gap.has_value()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", tensor_name, "\" of shape ", ShapeToString(global_size),
        ": no chunk holds index ", *gap, " of dimension ", dim,
        "; the saved chunks must cover the whole tensor"));
  }
  bool exact;
  if (rank <= kMaxCornerRank &&
      ((nonempty.size() + 1) << rank) * std::max<size_t>(rank, 1) <=
          kMaxCornerCoordinates) {
    exact = CornersMatch(global_size, chunks, nonempty);
  } else {
    unsigned __int128 volume = 0;
    for (size_t i : nonempty) volume += ChunkVolume(chunks[i]);
    exact = volume == static_cast<unsigned __int128>(total) &&
            !FindSelfOverlap(chunks, rank).has_value();
  }
  if (exact) return absl::OkStatus();
  if (auto pair = FindSelfOverlap(chunks, rank)) {
    return overlap_error(pair->first, pair->second);
  }
  unsigned __int128 volume = 0;
  for (size_t i : nonempty) volume += ChunkVolume(chunks[i]);
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor \"", tensor_name, "\" of shape ", ShapeToString(global_size),
      ": the saved chunks hold ", static_cast<uint64_t>(volume), " of ", total,
      " elements; the saved chunks must cover the whole tensor"));
}

}  // namespace dcp
