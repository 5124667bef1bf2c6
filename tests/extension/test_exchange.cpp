// Inventories and selections for sharing tuning between processes (exchange.h, Note [Sharing tuning between
// processes]).

#include <catch2/catch.hpp>
#include <set>

#include "cache_fixtures.h"
#include "cudnn_cache/exchange.h"
#include "cudnn_cache/report.h"
#include "cudnn_cache/synthetic.h"

using namespace cudnn_cache;
using cudnn_cache::testing::conv_key;
using cudnn_cache::testing::difference;
using cudnn_cache::testing::engine;

namespace {

const CudnnVersion kRunning{9, 19, 0};
const Origin kFirst = Origin::of(DeviceIdentity{"GPU A", 9, 0, 132}, kRunning);
const Origin kSecond = Origin::of(DeviceIdentity{"GPU B", 8, 0, 108}, kRunning);

// Synthetic entries of both origins, and a graph-API backward-filter entry of the first with a stored plan.
std::unique_ptr<CacheStore> store_with_a_plan(std::size_t first, std::size_t second, int seed,
                                              const ConvolutionKey& key) {
  auto store = std::make_unique<CacheStore>();
  add_synthetic_entries(*store, kFirst, first, seed);
  add_synthetic_entries(*store, kSecond, second, seed + 1);
  store->caches(kFirst).graph_backward_filter.insert(key,
                                                     Ranking<GraphBackwardFilterTraits>::of({engine(9, 0.25f)}));
  store->caches(kFirst).plans.insert(key, StoredPlan{engine(9, 0.25f), 91900, {4, 5, 6}});
  return store;
}

std::unordered_set<std::uint64_t> digests_of(const std::vector<EntryRecord>& records) {
  std::unordered_set<std::uint64_t> digests;
  for (const EntryRecord& record : records) digests.insert(record.digest);
  return digests;
}

}  // namespace

TEST_CASE("an inventory names every entry once, by origin, backend and key", "[exchange]") {
  CacheStore store;
  add_synthetic_entries(store, kFirst, 40, 1);
  add_synthetic_entries(store, kSecond, 30, 2);
  const Checkpoint checkpoint = snapshot(store);
  const std::vector<EntryRecord> records = inventory(checkpoint);
  REQUIRE(records.size() == 70);
  CHECK(digests_of(records).size() == 70);
  std::size_t graph = 0;
  for (const EntryRecord& record : records) {
    const DirectionCaches* caches = store.find(record.origin);
    REQUIRE(caches);
    graph += record.backend == Backend::graph;
    const bool found = record.backend == Backend::graph
                           ? (record.key.direction == 0   ? caches->graph_forward.find(record.key) != nullptr
                              : record.key.direction == 1 ? caches->graph_backward_data.find(record.key) != nullptr
                                                          : caches->graph_backward_filter.find(record.key) != nullptr)
                           : (record.key.direction == 0   ? caches->forward.find(record.key) != nullptr
                              : record.key.direction == 1 ? caches->backward_data.find(record.key) != nullptr
                                                          : caches->backward_filter.find(record.key) != nullptr);
    CHECK(found);
  }
  CHECK(graph > 0);
  CHECK(graph < records.size());
}

TEST_CASE("digests are equal for equal content and differ when the ranking or the plan differs", "[exchange]") {
  const ConvolutionKey key = conv_key(Direction::forward);
  auto store_with = [&](float time_ms, bool with_plan) {
    auto store = std::make_unique<CacheStore>();
    store->caches(kFirst).graph_forward.insert(key, Ranking<GraphForwardTraits>::of({engine(3, time_ms)}));
    if (with_plan) store->caches(kFirst).plans.insert(key, StoredPlan{engine(3, time_ms), 91900, {1, 2, 3}});
    return store;
  };
  const auto digest = [](const CacheStore& store) { return inventory(snapshot(store)).at(0).digest; };
  CHECK(digest(*store_with(1.0f, false)) == digest(*store_with(1.0f, false)));  // another process, same content
  CHECK(digest(*store_with(1.0f, false)) != digest(*store_with(2.0f, false)));
  CHECK(digest(*store_with(1.0f, false)) != digest(*store_with(1.0f, true)));

  CacheStore other_origin;
  other_origin.caches(kSecond).graph_forward.insert(key, Ranking<GraphForwardTraits>::of({engine(3, 1.0f)}));
  CHECK(digest(other_origin) != digest(*store_with(1.0f, false)));
}

TEST_CASE("select keeps exactly the chosen entries with their plans; merging selections rebuilds the whole",
          "[exchange]") {
  const std::unique_ptr<CacheStore> store = store_with_a_plan(60, 20, 3, conv_key(Direction::backward_filter, 5));
  const Checkpoint whole = snapshot(*store);
  const std::vector<EntryRecord> records = inventory(whole);

  // Split the entries in two halves, as two ranks would send them, and merge both into a fresh store.
  std::unordered_set<std::uint64_t> even, odd;
  for (std::size_t i = 0; i < records.size(); ++i) (i % 2 ? odd : even).insert(records[i].digest);
  const Checkpoint first = select(whole, even), second = select(whole, odd);
  CHECK(first.size() + second.size() == whole.size());
  CHECK(inventory(first).size() == even.size());
  CHECK(first.sections.at(0).plans.size() + second.sections.at(0).plans.size() == 1);
  CacheStore rebuilt;
  merge_into(rebuilt, deserialize(serialize(first), "rank 0"));
  merge_into(rebuilt, deserialize(serialize(second), "rank 1"));
  CHECK(difference(whole, snapshot(rebuilt)) == "");

  CHECK(select(whole, {}).sections.empty());
  const Checkpoint mine = only_origin(whole, kSecond);
  REQUIRE(mine.sections.size() == 1);
  CHECK(mine.sections[0].origin == kSecond);
  CHECK(mine.size() == 20);
}

// Note [Entries on a shared store].
TEST_CASE("entries on their own carry stable names, pass the store's decoder and merge back into the whole",
          "[exchange][remote]") {
  const ConvolutionKey key = conv_key(Direction::backward_filter, 7);
  const std::unique_ptr<CacheStore> store = store_with_a_plan(50, 10, 5, key);
  store->caches(kFirst).pending.insert(true, conv_key(Direction::forward, 8));
  const Checkpoint whole = snapshot(*store);
  const std::vector<SingleEntry> entries = split_entries(whole);
  REQUIRE(entries.size() == whole.size());

  std::set<std::string> names;
  std::vector<Checkpoint> decoded;
  std::size_t plans = 0;
  for (const SingleEntry& single : entries) {
    names.insert(single.name);
    CHECK(single.name.rfind(origin_tag(single.origin) + ":", 0) == 0);
    CHECK(single.name.size() == 33);  // two tags of 16 hex digits
    decoded.push_back(deserialize(serialize(single.checkpoint), single.name));
    CHECK_NOTHROW(check_single_entry(decoded.back(), single.name, "entry"));
    plans += decoded.back().sections.at(0).plans.size();
  }
  CHECK(names.size() == entries.size());  // one name per entry
  CHECK(plans == 1);                      // the stored plan travels with its entry
  CHECK(origin_tag(kFirst) != origin_tag(kSecond));
  CHECK(split_entries(whole).front().name == entries.front().name);  // the same in every process
  Checkpoint rejoined = merge(decoded).merged;
  Checkpoint expected = whole;
  for (CheckpointSection& section : expected.sections) section.pending_graph.clear();  // pending keys stay home
  CHECK(difference(expected, rejoined) == "");

  // The decoder refuses what is not the one entry of the name asked for.
  CHECK_THROWS_WITH(check_single_entry(decoded.at(0), entries.at(1).name, "remote"),
                    Catch::Contains("remote: holds the entry named " + entries.at(0).name));
  CHECK_THROWS_WITH(check_single_entry(whole, entries.at(0).name, "remote"),
                    Catch::Contains("expected exactly one entry and no pending keys, found 61 entries"));
  CHECK_THROWS_WITH(check_single_entry(Checkpoint{}, entries.at(0).name, "remote"),
                    Catch::Contains("found 0 entries"));
  Checkpoint foreign_plan = decoded.at(0);
  foreign_plan.sections.at(0).plans.emplace_back(key, std::make_shared<const StoredPlan>(
                                                          StoredPlan{engine(9, 0.25f), 91900, {4, 5, 6}}));
  CHECK_THROWS_WITH(check_single_entry(foreign_plan, entries.at(0).name, "remote"),
                    Catch::Contains("holds a stored plan of another entry"));
}

TEST_CASE("the entries a store holds by replace() are named as split_entries names them", "[exchange][remote]") {
  const ConvolutionKey graph_key = conv_key(Direction::backward_filter, 7);
  const ConvolutionKey legacy_key = conv_key(Direction::forward, 9);
  const std::unique_ptr<CacheStore> store = store_with_a_plan(5, 5, 5, graph_key);
  CHECK(replaced_entry_names(*store).empty());  // inserted, none replaced
  const auto graph_ranking = Ranking<GraphBackwardFilterTraits>::of({engine(3, 0.2f)});
  const auto legacy_ranking = Ranking<ForwardTraits>::of({testing::candidate<ForwardTraits>(1, 2.0f)});
  store->caches(kFirst).graph_backward_filter.replace(graph_key, graph_ranking);
  store->caches(kSecond).forward.replace(legacy_key, legacy_ranking);

  CacheStore alone;  // the same two entries in a store of their own: their names on a shared store
  alone.caches(kFirst).graph_backward_filter.insert(graph_key, graph_ranking);
  alone.caches(kSecond).forward.insert(legacy_key, legacy_ranking);
  std::vector<std::string> expected;
  for (const SingleEntry& single : split_entries(snapshot(alone))) expected.push_back(single.name);
  std::sort(expected.begin(), expected.end());
  CHECK(replaced_entry_names(*store) == expected);

  const auto faster = Ranking<ForwardTraits>::of({testing::candidate<ForwardTraits>(2, 1.0f)});
  store->caches(kSecond).forward.insert(legacy_key, faster);
  CHECK(replaced_entry_names(*store).size() == 1);  // merged since: no longer replaced
}
