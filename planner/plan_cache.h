// Plan caching for repeated saves (the seed's enable_plan_caching).
//
// Protocol, all inside DefaultSavePlanner:
// - A rank digests its local plan (every field that changes stored bytes:
//   names, offsets, sizes, dtypes, global shapes, value sizes, the flatten
//   mapping). If the coordinator already acknowledged a plan with that digest
//   (this rank holds the final plan it got for it), the rank sends an
//   "unchanged" marker instead: a SavePlan with no items whose planner_data
//   carries the digest.
// - The coordinator keeps each rank's recent local plans by digest, and its
//   recent global results by the digests of all ranks. When every rank's
//   plan is known, the cached final plans and metadata are reused without
//   validation or dedup; a rank whose final plan it already holds gets a
//   marker back carrying that final plan's digest.
// - FinishPlan turns a marker back into the cached final plan, checking the
//   digest (kFailedPrecondition on a mismatch, never a wrong plan).
// The cache remembers `capacity` distinct plans per rank, so alternating
// saves of different state dicts (model, then optimizer) each hit.
//
// Markers travel through the storage layer like any plan: it must pass
// planner_data through unchanged; storage_data it sets on a marker is kept.
#ifndef DCP_PLANNER_PLAN_CACHE_H_
#define DCP_PLANNER_PLAN_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "planner/metadata.h"
#include "planner/plan.h"
#include "planner/plan_codec.h"

namespace dcp {

// True when `plan` is an "unchanged" marker from a caching planner.
bool IsUnchangedSavePlan(const SavePlan& plan);

// Digest of a plan's items, flatten mapping and unheld tensors
// (SavePlannerData::unheld), not of its storage_data.
PlanDigest DigestSavePlan(
    const std::vector<WriteItem>& items, const FlattenMapping& mapping,
    const std::vector<std::pair<std::string, Shape>>& unheld = {});

// XXH3-128 of `bytes`.
PlanDigest DigestBytes(absl::string_view bytes);

// A small most-recently-used map from digest to value.
template <typename V>
class DigestLru {
 public:
  explicit DigestLru(size_t capacity) : capacity_(capacity) {}
  // The value for `key`, now the most recent; nullptr when absent.
  V* Find(const PlanDigest& key) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].first == key) {
        if (i != 0) {
          auto entry = std::move(entries_[i]);
          entries_.erase(entries_.begin() + i);
          entries_.insert(entries_.begin(), std::move(entry));
        }
        return &entries_[0].second;
      }
    }
    return nullptr;
  }
  V& Put(const PlanDigest& key, V value) {
    if (V* existing = Find(key)) {
      *existing = std::move(value);
      return *existing;
    }
    entries_.insert(entries_.begin(), {key, std::move(value)});
    if (entries_.size() > capacity_) entries_.pop_back();
    return entries_[0].second;
  }

 private:
  size_t capacity_;
  std::vector<std::pair<PlanDigest, V>> entries_;
};

// What one rank (and, on the coordinator, the coordinator role) remembers
// between saves. Internally locked; one save at a time per cache is
// expected.
class SavePlanCache {
 public:
  explicit SavePlanCache(size_t capacity = 4);

  // The cache DefaultSavePlanner uses when none is given: one per process
  // (the usual one rank per process).
  static std::shared_ptr<SavePlanCache> ProcessDefault();

  size_t capacity() const { return capacity_; }

  struct FinalEntry {
    PlanDigest final_digest;
    SavePlan final_plan;
  };
  struct CoordinatorRankEntry {
    SavePlan local_plan;
    SavePlannerData planner_data;  // Its flatten mapping.
    std::optional<PlanDigest> final_sent;
  };
  struct GlobalEntry {
    std::vector<SavePlan> final_plans;
    std::vector<PlanDigest> final_digests;
    // Handed out as is (DefaultSavePlanner::CreateSharedGlobalPlan); its
    // storage_meta is that of the last save it was handed out for. Modified
    // only while the cache is its sole owner, else replaced by a copy.
    std::shared_ptr<Metadata> metadata;
  };

  // Rank side: final plans by the digest of the local plan they answer.
  DigestLru<FinalEntry>& rank_finals() { return rank_finals_; }
  // Coordinator side: each rank's recent local plans by digest.
  DigestLru<CoordinatorRankEntry>& coordinator_rank(size_t rank);
  // Coordinator side: global results by the digest of all local digests.
  DigestLru<GlobalEntry>& coordinator_globals() { return globals_; }

  absl::Mutex& mutex() { return mutex_; }

 private:
  const size_t capacity_;
  absl::Mutex mutex_;
  DigestLru<FinalEntry> rank_finals_;
  std::vector<DigestLru<CoordinatorRankEntry>> ranks_;
  DigestLru<GlobalEntry> globals_;
};

}  // namespace dcp

#endif  // DCP_PLANNER_PLAN_CACHE_H_
