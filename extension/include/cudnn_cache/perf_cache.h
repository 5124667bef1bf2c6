#pragma once

// Perf caches: for each convolution key, the ranked candidates a search measured. One generic, thread-safe
// cache serves each direction through a traits struct.
//
// Note [Selection, merge and fallback policy]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What wins. A ranking lists the candidates of one key best first:
//   1. candidates that ran (status CUDNN_STATUS_SUCCESS) before those that failed;
//   2. among those that ran, the faster measured time first;
//   3. on equal times, the smaller workspace first;
//   4. then by algorithm, math type and determinism, so that the order is total and files are reproducible.
// A ranking holds one candidate per choice (legacy: algorithm and math type; graph API: engine and knobs)
// and at most Ranking::capacity of them: every algorithm of the legacy API, every config a graph search can time.
//
// Merge rule. When a key already has a ranking (a load into a non-empty cache, merging two files, a re-tune),
// the two are merged candidate by candidate: for each choice the better measurement by the
// order above is kept (a faster measured time wins; on a tie, the smaller workspace wins; a success beats a
// failure), and the union is ranked again. Measurements are never averaged: each one is a median already. What
// cuDNN says of a config itself (its numerical notes) is kept from whichever measurement knows it.
//
// Fallback. A caller walks a ranking front to back and runs the first candidate that fits its constraints
// (determinism when deterministic algorithms are requested) and whose workspace it can allocate; when one
// fails at run time (out of memory, NOT_SUPPORTED) it moves on to the next, and after the last to cuDNN's
// heuristics. Failed candidates stay in the ranking, after the successful ones, as a record of what did not
// work; they are never chosen.
//
// Other GPUs and cuDNN versions. Measurements hold only for the GPU model and cuDNN release they were taken
// on, so every ranking lives under an Origin (device identity + cuDNN major.minor, cache_store.h). Rankings of
// another origin are loaded, kept and saved again, but never used: a process only looks up its own origin. A
// miss whose key another origin holds counts as a fallback (Note [Running a cached convolution]).

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <tuple>
#include <type_traits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cudnn_cache/cudnn.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/key.h"

namespace cudnn_cache {

template <typename Traits>
struct Candidate;

// Direction traits of the legacy API: the cuDNN algorithm and perf types of each direction.
struct ForwardTraits {
  using Candidate = cudnn_cache::Candidate<ForwardTraits>;
  static constexpr Direction direction = Direction::forward;
  using Algorithm = cudnnConvolutionFwdAlgo_t;
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static constexpr int algorithm_count = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  // cuDNN's name without the common prefix, e.g. "IMPLICIT_PRECOMP_GEMM".
  static std::string algorithm_name(int algorithm);
  // The candidate's choice, for listings.
  static std::string describe(const Candidate& candidate);
};

struct BackwardDataTraits {
  using Candidate = cudnn_cache::Candidate<BackwardDataTraits>;
  static constexpr Direction direction = Direction::backward_data;
  using Algorithm = cudnnConvolutionBwdDataAlgo_t;
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static constexpr int algorithm_count = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static std::string algorithm_name(int algorithm);
  static std::string describe(const Candidate& candidate);
};

struct BackwardFilterTraits {
  using Candidate = cudnn_cache::Candidate<BackwardFilterTraits>;
  static constexpr Direction direction = Direction::backward_filter;
  using Algorithm = cudnnConvolutionBwdFilterAlgo_t;
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static constexpr int algorithm_count = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static std::string algorithm_name(int algorithm);
  static std::string describe(const Candidate& candidate);
};

// The name of an algorithm of the given direction, or "ALGO_<n>" for a number cuDNN does not define.
std::string algorithm_name(Direction direction, int algorithm);

// At most this many legacy candidates are kept per key: every algorithm of the largest direction.
inline constexpr std::size_t kMaxCandidates = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;

// At most this many engine configs are kept per key: more than a graph search times (Note [Search bounds]
// keeps its bounds within this, so none it timed is dropped).
inline constexpr std::size_t kMaxEngineConfigs = 32;

// One measured algorithm choice for a key.
template <typename Traits>
struct Candidate {
  typename Traits::Algorithm algorithm{};
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  float time_ms = 0.0f;  // median measured time
  std::uint64_t workspace_bytes = 0;
  cudnnDeterminism_t determinism = CUDNN_NON_DETERMINISTIC;
  cudnnMathType_t math_type = CUDNN_DEFAULT_MATH;

  // The candidate cudnnFind*AlgorithmEx reported. cuDNN gives a failed algorithm the time -1; it is stored
  // as 0, since a failure has no time and every stored time is >= 0.
  static Candidate from_perf(const typename Traits::Perf& perf) {
    const float time = perf.status == CUDNN_STATUS_SUCCESS ? perf.time : 0.0f;
    return {perf.algo, perf.status, time, static_cast<std::uint64_t>(perf.memory), perf.determinism, perf.mathType};
  }

  bool succeeded() const { return status == CUDNN_STATUS_SUCCESS; }

  // One measurement per choice is kept in a ranking: an algorithm with a math type.
  bool same_choice(const Candidate& other) const {
    return algorithm == other.algorithm && math_type == other.math_type;
  }
  // A total order among candidates whose time and workspace do not decide.
  bool tie_break_less(const Candidate& other) const {
    return std::tie(algorithm, math_type, determinism, status) <
           std::tie(other.algorithm, other.math_type, other.determinism, other.status);
  }

  friend bool operator==(const Candidate& a, const Candidate& b) {
    return a.algorithm == b.algorithm && a.status == b.status && a.time_ms == b.time_ms &&
           a.workspace_bytes == b.workspace_bytes && a.determinism == b.determinism && a.math_type == b.math_type;
  }
  friend bool operator!=(const Candidate& a, const Candidate& b) { return !(a == b); }
};

// One knob choice of a graph-API engine: a cudnn_frontend::KnobType_t value and the value chosen.
struct Knob {
  std::int64_t type = 0;
  std::int64_t value = 0;
  friend bool operator==(const Knob& a, const Knob& b) { return a.type == b.type && a.value == b.value; }
  friend bool operator!=(const Knob& a, const Knob& b) { return !(a == b); }
  friend bool operator<(const Knob& a, const Knob& b) {
    return std::tie(a.type, a.value) < std::tie(b.type, b.value);
  }
};

// Engines take at most this many knobs (seen on Hopper: 6).
inline constexpr std::size_t kMaxKnobs = 12;

// One timed engine config of the graph API: see Note [Engine configs] in graph.h. Only configs that ran are
// stored, so a stored one always "succeeded"; one that fails later is a fallback at run time.
struct EngineCandidate {
  std::int64_t engine_id = -1;
  std::array<Knob, kMaxKnobs> knobs{};  // the first knob_count, sorted by type; the rest zero
  std::int32_t knob_count = 0;
  float time_ms = 0.0f;  // median measured time
  std::uint64_t workspace_bytes = 0;
  std::int32_t behavior_notes = 0;  // bit n set: cudnn_frontend::BehaviorNote_t value n (see kRuntimeCompiled)
  // kNotListed: the config is its engine and knobs. Otherwise the config is the plan at this position of
  // heuristics' list for the key (mode A, then the fallback list), whose knobs include types cudnn-frontend
  // cannot name; engine_id and knobs are the part it can, checked when the plan is made again (Note [Engine
  // configs] in graph.h).
  std::int32_t heuristic_index = kNotListed;
  // Bit n set: cudnn_frontend::NumericalNote_t value n, cuDNN's numerical notes of the engine (see
  // kNondeterministic); kNotesUnknown for a config stored before file format 5, which recorded none.
  std::int32_t numerical_notes = kNotesUnknown;

  static constexpr std::int32_t kNotListed = -1;
  static constexpr std::int32_t kNotesUnknown = -1;

  // The behavior note cuDNN gives engines it compiles at run time (BehaviorNote_t::RUNTIME_COMPILATION).
  static constexpr std::int32_t kRuntimeCompiled = 1 << 1;
  // The numerical note of engines whose results may differ from run to run (NumericalNote_t::NONDETERMINISTIC,
  // e.g. split reductions that accumulate with atomics).
  static constexpr std::int32_t kNondeterministic = 1 << 5;

  bool succeeded() const { return true; }
  // Whether cuDNN reports the engine deterministic: what a deterministic call may run. A config whose notes
  // are unknown is not known to be.
  bool deterministic() const { return deterministic_notes(numerical_notes); }
  // Whether numerical notes (as numerical_notes holds them) are those of a deterministic engine.
  static constexpr bool deterministic_notes(std::int32_t notes) {
    return notes != kNotesUnknown && (notes & kNondeterministic) == 0;
  }
  const Knob* knobs_begin() const { return knobs.data(); }
  const Knob* knobs_end() const { return knobs.data() + knob_count; }

  bool same_choice(const EngineCandidate& other) const {
    return engine_id == other.engine_id && heuristic_index == other.heuristic_index &&
           std::equal(knobs_begin(), knobs_end(), other.knobs_begin(), other.knobs_end());
  }
  bool tie_break_less(const EngineCandidate& other) const {
    if (engine_id != other.engine_id) return engine_id < other.engine_id;
    if (heuristic_index != other.heuristic_index) return heuristic_index < other.heuristic_index;
    return std::lexicographical_compare(knobs_begin(), knobs_end(), other.knobs_begin(), other.knobs_end());
  }

  friend bool operator==(const EngineCandidate& a, const EngineCandidate& b) {
    return a.same_choice(b) && a.time_ms == b.time_ms && a.workspace_bytes == b.workspace_bytes &&
           a.behavior_notes == b.behavior_notes && a.numerical_notes == b.numerical_notes;
  }
  friend bool operator!=(const EngineCandidate& a, const EngineCandidate& b) { return !(a == b); }
};

// "engine 22 (k2=16, k13=0)": the engine's global index and knob choices (cudnn-frontend's knob numbering),
// " as heuristics' config #3" for a config made again from heuristics' list, and " runtime-compiled" when cuDNN
// compiles it at run time.
std::string to_string(const EngineCandidate& candidate);

// Direction traits of the graph API.
template <Direction D>
struct GraphTraits {
  static constexpr Direction direction = D;
  using Candidate = EngineCandidate;
  static std::string describe(const Candidate& candidate) { return to_string(candidate); }
};
using GraphForwardTraits = GraphTraits<Direction::forward>;
using GraphBackwardDataTraits = GraphTraits<Direction::backward_data>;
using GraphBackwardFilterTraits = GraphTraits<Direction::backward_filter>;

// Whether Traits is one of the graph API's (its candidates are engine configs), not one of the legacy API's.
template <typename Traits>
inline constexpr bool is_graph = std::is_same_v<typename Traits::Candidate, EngineCandidate>;

// True when a ranks before b; see Note [Selection, merge and fallback policy].
template <typename Traits>
bool ranks_before(const typename Traits::Candidate& a, const typename Traits::Candidate& b) {
  if (a.succeeded() != b.succeeded()) return a.succeeded();
  if (a.succeeded()) {
    if (a.time_ms != b.time_ms) return a.time_ms < b.time_ms;
    if (a.workspace_bytes != b.workspace_bytes) return a.workspace_bytes < b.workspace_bytes;
  }
  return a.tie_break_less(b);
}

// The candidates of one key, best first. A cache shares the rankings it holds (PerfCache::find), so a hit
// copies none.
template <typename Traits>
class Ranking {
 public:
  using value_type = typename Traits::Candidate;
  using const_iterator = const value_type*;

  // The most candidates a ranking keeps: kMaxCandidates algorithms, or kMaxEngineConfigs engine configs.
  static constexpr std::size_t capacity = is_graph<Traits> ? kMaxEngineConfigs : kMaxCandidates;

  Ranking() = default;

  // Ranks any number of candidates by Note [Selection, merge and fallback policy].
  template <typename Iterator>
  static Ranking of(Iterator first, Iterator last) {
    std::vector<value_type> all(first, last);
    std::sort(all.begin(), all.end(), ranks_before<Traits>);
    Ranking ranking;
    ranking.candidates_.reserve(std::min(all.size(), capacity));
    for (const value_type& candidate : all) {
      const auto kept = std::find_if(ranking.candidates_.begin(), ranking.candidates_.end(),
                                     [&](const value_type& k) { return k.same_choice(candidate); });
      if (kept == ranking.candidates_.end()) {
        if (ranking.size() < capacity) ranking.candidates_.push_back(candidate);
        continue;
      }
      // The first seen is the better measurement. What cuDNN says of the config itself is the same in every
      // measurement of it, so a worse one that knows it (a new search) completes a better one that does not
      // (a file of format <= 4, which recorded no numerical notes): else the merge would hide that the config
      // is deterministic, and a deterministic call would pass it over.
      if constexpr (is_graph<Traits>) {
        if (kept->numerical_notes == EngineCandidate::kNotesUnknown) kept->numerical_notes = candidate.numerical_notes;
      }
    }
    return ranking;
  }
  static Ranking of(std::initializer_list<value_type> candidates) { return of(candidates.begin(), candidates.end()); }

  // The candidates as they are, if they are what of() would make of them (at most `capacity`, in rank order,
  // no choice twice), else nullopt: how a file's ranking is read, without ranking it again.
  static std::optional<Ranking> of_ranked(std::vector<value_type> candidates) {
    if (candidates.size() > capacity) return std::nullopt;
    for (std::size_t i = 1; i < candidates.size(); ++i) {
      if (!ranks_before<Traits>(candidates[i - 1], candidates[i])) return std::nullopt;
      for (std::size_t j = 0; j < i; ++j) {
        if (candidates[j].same_choice(candidates[i])) return std::nullopt;
      }
    }
    Ranking ranking;
    ranking.candidates_ = std::move(candidates);
    return ranking;
  }

  // The ranking of what a cudnnFind*AlgorithmEx call returned.
  template <typename Perf>  // Traits::Perf; a template so the graph API's traits need none
  static Ranking of_perfs(const Perf* perfs, int count) {
    std::vector<value_type> candidates;
    for (int i = 0; i < count; ++i) candidates.push_back(value_type::from_perf(perfs[i]));
    return of(candidates.begin(), candidates.end());
  }

  std::size_t size() const { return candidates_.size(); }
  bool empty() const { return candidates_.empty(); }
  const_iterator begin() const { return candidates_.data(); }
  const_iterator end() const { return candidates_.data() + candidates_.size(); }
  const value_type& operator[](std::size_t i) const { return candidates_[i]; }
  // The best candidate; the ranking must not be empty.
  const value_type& front() const { return candidates_[0]; }

  friend bool operator==(const Ranking& a, const Ranking& b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }
  friend bool operator!=(const Ranking& a, const Ranking& b) { return !(a == b); }

 private:
  std::vector<value_type> candidates_;
};

// The merge rule of Note [Selection, merge and fallback policy].
template <typename Traits>
Ranking<Traits> merge(const Ranking<Traits>& a, const Ranking<Traits>& b) {
  std::vector<typename Traits::Candidate> all(a.begin(), a.end());
  all.insert(all.end(), b.begin(), b.end());
  return Ranking<Traits>::of(all.begin(), all.end());
}

// Note [A settled key replaces the file's]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// settle (Note [Settling in steady state] in paired_timing.h) stores a key's ranking with replace(): its times
// are the settle's, taken in steady state, where the search timed the same configs under the tuning's load. A
// merge compares candidates' times config by config, whichever clock took them, so merged with a file's ranking
// of that key (a merging save; the warm start's file usually holds the key already) the config the settle
// displaced can lead again on the time the file keeps for it, and the settle is undone without a word. A cache
// therefore remembers the keys it last stored by replace(); a merge (insert), erase or clear forgets the mark.
// A merging save writes those keys' rankings in place of the file's and merges every other key as before
// (checkpoint.cpp, save). load() still merges: a file loaded after a settle is newer news than the settle.

// Note [Cache versions]
// ~~~~~~~~~~~~~~~~~~~~~
// Each PerfCache, and the runtime's plan cache, carries a version: a number from one process-wide sequence,
// replaced by the next every time what a lookup may return changes (a ranking stored, merged, erased or cleared;
// a plan evicted). A number so names one state of one cache, even where a cache is destroyed and another is made
// at its address: whatever was read from a cache after its version was read stays what that cache holds for as
// long as the version reads the same. The per-thread memo of the run path relies on it (Note [Each thread's own
// hits] in call_memo.h).
std::uint64_t next_cache_version();

// One direction's cache: convolution key -> ranking. Safe to use from many threads at once. Rankings are
// immutable once stored: a lookup shares the stored one (a reference count, no copy), and an insert replaces it,
// so a caller keeps a consistent ranking however long it walks it.
template <typename Traits>
class PerfCache {
 public:
  using Entry = std::pair<ConvolutionKey, Ranking<Traits>>;
  using Shared = std::shared_ptr<const Ranking<Traits>>;

  // The ranking stored for the key, or null on a miss. A miss never inserts and never throws.
  Shared find(const ConvolutionKey& key) const {
    std::shared_lock lock(mutex_);
    const auto found = rankings_.find(key);
    return found == rankings_.end() ? nullptr : found->second;
  }

  // Stores the ranking under the key, merged with what the key already holds; what the key borrowed is
  // forgotten. Throws Error if the key belongs to another direction or the ranking is empty.
  void insert(const ConvolutionKey& key, Ranking<Traits> ranking) { store(key, std::move(ranking), true); }

  // Stores the ranking under the key in place of what the key holds, unmerged: a ranking settled again from
  // its own (Note [Settling in steady state] in paired_timing.h), whose times a merge would undo. A lookup sees
  // the old ranking or the new one, never a miss. The key is remembered as replaced until it is merged,
  // erased or cleared (Note [A settled key replaces the file's]). Throws Error as insert does.
  void replace(const ConvolutionKey& key, Ranking<Traits> ranking) { store(key, std::move(ranking), false); }

  // The key nearest to `key` among those of its family the cache holds, and its ranking; a null ranking when
  // it holds none (Note [Nearest key]). Never `key` itself: call it on a miss.
  std::pair<ConvolutionKey, Shared> nearest(const ConvolutionKey& key) const {
    std::pair<ConvolutionKey, Shared> found{};
    std::shared_lock lock(mutex_);
    for (const auto& [held, ranking] : rankings_) {
      if (held == key || !same_family(key, held)) continue;
      if (!found.second || nearer(key, held, found.first)) found = {held, ranking};
    }
    return found;
  }

  // What an untuned miss lent a key the cache does not hold (the nearest key's candidates, or native heuristics'
  // choice: Note [Native heuristics' choice] in runtime.h): the candidates it runs until the key is tuned, or
  // null if nothing was lent to it yet. Lending again replaces what was lent. Lent rankings are neither listed,
  // counted nor saved; a key's is forgotten when the key is inserted, erased or cleared. They are a memo of a
  // miss's answer, so that a training run whose shapes keep changing stays flat in memory, at most kMaxLent
  // are kept: lending past that forgets all the others first (each is worked out again on its key's next miss).
  Shared lent(const ConvolutionKey& key) const {
    std::shared_lock lock(mutex_);
    const auto found = lent_.find(key);
    return found == lent_.end() ? nullptr : found->second;
  }
  void lend(const ConvolutionKey& key, Shared ranking) {
    std::unique_lock lock(mutex_);
    if (rankings_.count(key) != 0) return;
    if (lent_.size() >= kMaxLent && lent_.count(key) == 0) lent_.clear();
    lent_[key] = std::move(ranking);
  }
  static constexpr std::size_t kMaxLent = 10000;

  // Makes room for `more` keys at once, so that a load does not rehash as it inserts.
  void reserve(std::size_t more) {
    std::unique_lock lock(mutex_);
    rankings_.reserve(rankings_.size() + more);
  }

  // Removes the key; returns whether it was there.
  bool erase(const ConvolutionKey& key) {
    std::unique_lock lock(mutex_);
    lent_.erase(key);
    replaced_.erase(key);
    if (rankings_.erase(key) == 0) return false;
    changed();
    return true;
  }

  std::size_t size() const {
    std::shared_lock lock(mutex_);
    return rankings_.size();
  }

  void clear() {
    std::unique_lock lock(mutex_);
    rankings_.clear();
    lent_.clear();
    replaced_.clear();
    changed();
  }

  // The cache's version (Note [Cache versions]): read it before a lookup whose answer is to be kept.
  std::uint64_t version() const { return version_.load(std::memory_order_acquire); }

  // A snapshot of every entry, sorted by key, so listings and files are reproducible.
  std::vector<Entry> entries() const {
    return entries_where([](const ConvolutionKey&) { return true; });
  }

  // A snapshot of the entries stored by replace() and not merged, erased or cleared since, sorted by key: what
  // a merging save writes in place of the file's rankings (Note [A settled key replaces the file's]).
  std::vector<Entry> replaced_entries() const {
    return entries_where([this](const ConvolutionKey& key) { return replaced_.count(key) != 0; });
  }

 private:
  // The entries whose key `wanted` accepts, sorted by key; `wanted` is called under the shared lock.
  template <typename Wanted>
  std::vector<Entry> entries_where(const Wanted& wanted) const {
    std::vector<Entry> snapshot;
    {
      std::shared_lock lock(mutex_);
      snapshot.reserve(rankings_.size());
      for (const auto& [key, ranking] : rankings_) {
        if (wanted(key)) snapshot.emplace_back(key, *ranking);
      }
    }
    std::sort(snapshot.begin(), snapshot.end(), [](const Entry& a, const Entry& b) { return a.first < b.first; });
    return snapshot;
  }

  // insert (merging) and replace (not).
  void store(const ConvolutionKey& key, Ranking<Traits> ranking, bool merging) {
    CUDNN_CACHE_REQUIRE(key.direction == static_cast<std::int32_t>(Traits::direction), "the ",
                        to_string(Traits::direction), " cache cannot hold a key of direction ",
                        to_string(static_cast<Direction>(key.direction)), " (", key, ")");
    CUDNN_CACHE_REQUIRE(!ranking.empty(), "cannot cache an empty ranking for ", key);
    std::unique_lock lock(mutex_);
    Shared& slot = rankings_[key];
    slot = std::make_shared<const Ranking<Traits>>(slot && merging ? merge(*slot, ranking) : std::move(ranking));
    lent_.erase(key);
    if (merging) {
      replaced_.erase(key);
    } else {
      replaced_.insert(key);
    }
    changed();
  }

  // A new version, under the exclusive lock, after the change it marks.
  void changed() { version_.store(next_cache_version(), std::memory_order_release); }

  mutable std::shared_mutex mutex_;
  std::unordered_map<ConvolutionKey, Shared, KeyHash> rankings_;
  std::unordered_map<ConvolutionKey, Shared, KeyHash> lent_;  // keys rankings_ does not hold
  std::unordered_set<ConvolutionKey, KeyHash> replaced_;      // keys last stored by replace()
  std::atomic<std::uint64_t> version_{next_cache_version()};
};

}  // namespace cudnn_cache
