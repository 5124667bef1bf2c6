#include "cudnn_cache/exchange.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <type_traits>

#include "cudnn_cache/error.h"
#include "cudnn_cache/serialization.h"

namespace cudnn_cache {
namespace {

template <typename Traits>
constexpr Backend backend_of() {
  return is_graph<Traits> ? Backend::graph : Backend::legacy;
}

// The stored plan of the key in the section, or null; only graph entries have one.
template <typename Traits>
const StoredPlan* plan_of(const CheckpointSection& section, const ConvolutionKey& key) {
  if constexpr (!is_graph<Traits>) return nullptr;
  const auto found =
      std::lower_bound(section.plans.begin(), section.plans.end(), key,
                       [](const PlanStore::Entry& entry, const ConvolutionKey& k) { return entry.first < k; });
  return found != section.plans.end() && found->first == key ? found->second.get() : nullptr;
}

// The file's checksum (Note [Checksum]) over the portable archive of `values`.
template <typename... Values>
std::uint64_t archive_checksum(const Values&... values) {
  std::ostringstream bytes(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive archive(bytes);
    archive(values...);
  }
  const std::string text = std::move(bytes).str();
  return checksum(text.data(), text.size());
}

// The digest of an entry: the checksum of everything it is.
template <typename Traits>
std::uint64_t digest(const Origin& origin, const ConvolutionKey& key, const Ranking<Traits>& ranking,
                     const StoredPlan* plan) {
  const auto backend = static_cast<std::int32_t>(backend_of<Traits>());
  return plan ? archive_checksum(origin, backend, key, ranking, true, *plan)
              : archive_checksum(origin, backend, key, ranking, false);
}

// archive_checksum as 16 hex digits.
template <typename... Values>
std::string tag_of(const Values&... values) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(archive_checksum(values...)));
  return hex;
}

std::string entry_name(const Origin& origin, Backend backend, const ConvolutionKey& key) {
  return origin_tag(origin) + ":" + tag_of(static_cast<std::int32_t>(backend), key);
}

}  // namespace

std::vector<EntryRecord> inventory(const Checkpoint& checkpoint) {
  std::vector<EntryRecord> records;
  for (const CheckpointSection& section : checkpoint.sections) {
    for_each_cache([&](auto traits) {
      using Traits = decltype(traits);
      for (const auto& [key, ranking] : section.entries<Traits>()) {
        const StoredPlan* plan = plan_of<Traits>(section, key);
        records.push_back({section.origin, backend_of<Traits>(), key, digest(section.origin, key, ranking, plan)});
      }
    });
  }
  return records;
}

Checkpoint select(const Checkpoint& checkpoint, const std::unordered_set<std::uint64_t>& digests) {
  Checkpoint result;
  result.header = checkpoint.header;
  for (const CheckpointSection& section : checkpoint.sections) {
    CheckpointSection chosen;
    chosen.origin = section.origin;
    for_each_cache([&](auto traits) {
      using Traits = decltype(traits);
      for (const auto& entry : section.entries<Traits>()) {
        const auto& [key, ranking] = entry;
        const StoredPlan* plan = plan_of<Traits>(section, key);
        if (digests.count(digest(section.origin, key, ranking, plan)) == 0) continue;
        chosen.entries<Traits>().push_back(entry);
        if (plan) chosen.plans.emplace_back(key, std::make_shared<const StoredPlan>(*plan));
      }
    });
    // Plans stay sorted by key: the caches are each sorted, but a key appears in at most one of the three
    // graph caches (its direction is part of it), so sorting the few chosen plans is all that is needed.
    std::sort(chosen.plans.begin(), chosen.plans.end(),
              [](const PlanStore::Entry& a, const PlanStore::Entry& b) { return a.first < b.first; });
    if (chosen.size() > 0) result.sections.push_back(std::move(chosen));
  }
  return result;
}

std::string origin_tag(const Origin& origin) { return tag_of(origin); }

std::vector<SingleEntry> split_entries(const Checkpoint& checkpoint) {
  std::vector<SingleEntry> result;
  for (const CheckpointSection& section : checkpoint.sections) {
    for_each_cache([&](auto traits) {
      using Traits = decltype(traits);
      for (const auto& entry : section.entries<Traits>()) {
        const ConvolutionKey& key = entry.first;
        SingleEntry single{section.origin, entry_name(section.origin, backend_of<Traits>(), key), {}};
        single.checkpoint.header = checkpoint.header;
        CheckpointSection& alone = single.checkpoint.sections.emplace_back();
        alone.origin = section.origin;
        alone.entries<Traits>().push_back(entry);
        if (const StoredPlan* plan = plan_of<Traits>(section, key)) {
          alone.plans.emplace_back(key, std::make_shared<const StoredPlan>(*plan));
        }
        result.push_back(std::move(single));
      }
    });
  }
  return result;
}

std::vector<std::string> replaced_entry_names(const CacheStore& store) {
  std::vector<std::string> names;
  for_each_replaced(store, [&](const Origin& origin, auto traits, const ConvolutionKey& key, const auto&) {
    names.push_back(entry_name(origin, backend_of<decltype(traits)>(), key));
  });
  std::sort(names.begin(), names.end());
  return names;
}

void check_single_entry(const Checkpoint& checkpoint, const std::string& name, const std::string& source) {
  CUDNN_CACHE_REQUIRE(checkpoint.sections.size() == 1 && checkpoint.size() == 1 && checkpoint.pending() == 0, source,
                      ": expected exactly one entry and no pending keys, found ", checkpoint.size(), " entries and ",
                      checkpoint.pending(), " pending keys");
  const CheckpointSection& section = checkpoint.sections.front();
  std::string found;
  const ConvolutionKey* key = nullptr;
  bool graph = false;
  for_each_cache([&](auto traits) {
    using Traits = decltype(traits);
    for (const auto& entry : section.entries<Traits>()) {
      found = entry_name(section.origin, backend_of<Traits>(), entry.first);
      key = &entry.first;
      graph = backend_of<Traits>() == Backend::graph;
    }
  });
  CUDNN_CACHE_REQUIRE(found == name, source, ": holds the entry named ", found, ", not ", name);
  CUDNN_CACHE_REQUIRE(
      section.plans.empty() || (graph && section.plans.size() == 1 && section.plans.front().first == *key), source,
      ": holds a stored plan of another entry");
}

Checkpoint only_origin(const Checkpoint& checkpoint, const Origin& origin) {
  Checkpoint result;
  result.header = checkpoint.header;
  for (const CheckpointSection& section : checkpoint.sections) {
    if (section.origin == origin) result.sections.push_back(section);
  }
  return result;
}

}  // namespace cudnn_cache
