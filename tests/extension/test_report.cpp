// Cache files as people read them (report.h) and as JSON (to_json / from_json in checkpoint.h): summaries and
// tables, diffs, merges with their conflicts, and JSON round trips with the loader's checks.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <regex>

#include "cache_fixtures.h"
#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/report.h"
#include "cudnn_cache/synthetic.h"

using namespace cudnn_cache;
using Catch::Matchers::Contains;
using cudnn_cache::testing::candidate;
using cudnn_cache::testing::conv_key;
using cudnn_cache::testing::difference;
using cudnn_cache::testing::engine;
using cudnn_cache::testing::error_of;

namespace {

// The format version line of an export this build writes.
const std::string kCurrent = "\"format_version\": " + std::to_string(kFormatVersion);

// `json` with its first `from` replaced by `to`; the test fails if `from` is not in it.
std::string replaced(std::string json, const std::string& from, const std::string& to) {
  const std::size_t at = json.find(from);
  REQUIRE(at != std::string::npos);
  return json.replace(at, from.size(), to);
}

// Every kind of content: synthetic entries of both APIs, a legacy and a graph entry by hand, a stored plan.
Checkpoint sample() {
  CacheStore store;
  add_synthetic_entries(store, synthetic_origin(), 40, 3);
  DirectionCaches& caches = store.caches(synthetic_origin());
  caches.forward.insert(conv_key(Direction::forward, 5),
                        Ranking<ForwardTraits>::of({candidate<ForwardTraits>(1, 0.5f)}));
  caches.graph_forward.insert(conv_key(Direction::forward, 5),
                              Ranking<GraphForwardTraits>::of({engine(9, 0.25f, {{2, 16}, {13, 1}})}));
  StoredPlan plan;
  plan.config = engine(9, 0.25f, {{2, 16}, {13, 1}});
  plan.cudnn_version = 91900;
  plan.bytes = {0, 1, 2, 250, 251, 255, 7};
  caches.plans.insert(conv_key(Direction::forward, 5), plan);
  caches.pending.insert(true, conv_key(Direction::backward_data, 11));
  caches.pending.insert(true, conv_key(Direction::forward, 12));
  caches.pending.insert(false, conv_key(Direction::backward_filter, 13));
  return snapshot(store);
}

}  // namespace

TEST_CASE("a checkpoint round-trips through JSON, stored plans included", "[report][json]") {
  const Checkpoint original = sample();
  const std::string json = to_json(original);
  CHECK_THAT(json, Contains("\"graph_forward\"") && Contains("\"stored_plans\"") && Contains("\"knobs\"") &&
                       Contains("\"pending_graph\"") && Contains("\"pending_legacy\""));
  CHECK(original.pending() == 3);
  const Checkpoint read = from_json(json, "export.json");
  CHECK(read.header.format_version == original.header.format_version);
  CHECK(difference(original, read) == "");
  CHECK(to_json(read) == json);
}

namespace {

// What a build of an older format exported: its engine configs are of cereal class `version` (1: format 3,
// 2: format 4), without the fields added since.
std::string older_export(const Checkpoint& checkpoint, int version) {
  std::string json = std::regex_replace(to_json(checkpoint), std::regex(",\\s*\"numerical_notes\": -?[0-9]+"), "");
  if (version < 2) json = std::regex_replace(json, std::regex(",\\s*\"heuristic_index\": -?[0-9]+"), "");
  const std::string current = "\"cereal_class_version\": 3";
  const std::size_t engine_class = json.find(current);
  REQUIRE(engine_class != std::string::npos);  // EngineCandidate's, the only class of version 3
  json.replace(engine_class, current.size(), "\"cereal_class_version\": " + std::to_string(version));
  return json;
}

// How many graph forward configs of the checkpoint satisfy `holds`.
template <typename Predicate>
std::size_t count_configs(const Checkpoint& checkpoint, Predicate holds) {
  std::size_t count = 0;
  for (const CheckpointSection& section : checkpoint.sections) {
    for (const auto& [key, ranking] : section.graph_forward) {
      count += std::count_if(ranking.begin(), ranking.end(), holds);
    }
  }
  return count;
}

}  // namespace

TEST_CASE("exports of formats 3 and 4 import, engine-config fields added since taking their defaults",
          "[report][json]") {
  struct Older {
    std::uint32_t format;
    int engine_class_version;
    bool (*holds_newer_field)(const EngineCandidate&);
  };
  const Older older[] = {
      {3, 1, [](const EngineCandidate& config) { return config.heuristic_index != EngineCandidate::kNotListed; }},
      {4, 2, [](const EngineCandidate& config) { return config.numerical_notes != EngineCandidate::kNotesUnknown; }},
  };
  for (const Older& format : older) {
    CAPTURE(format.format);
    Checkpoint original = sample();
    if (format.format < 4) {  // no pending keys in its JSON
      for (CheckpointSection& section : original.sections) section.pending_graph = section.pending_legacy = {};
    }
    original.header.format_version = format.format;
    const Checkpoint read = from_json(older_export(original, format.engine_class_version), "older.json");
    CHECK(read.header.format_version == format.format);
    CHECK(count_configs(original, format.holds_newer_field) > 0);  // else the sample does not exercise the field
    CHECK(count_configs(read, format.holds_newer_field) == 0);
    CHECK(read.size() == original.size());
  }
}

TEST_CASE("JSON that is not a valid export is rejected, naming the source and the reason", "[report][json]") {
  const std::string json = to_json(sample());
  std::string text, reason;
  SECTION("not JSON") {
    text = "{ \"format_version\": 4, ";
    reason = "not a valid cudnn_cache JSON export: not JSON at byte 23 (Missing a name for object member.)";
  }
  SECTION("a newer format") {
    text = replaced(json, kCurrent, "\"format_version\": 9");
    reason = "format_version 9";
  }
  SECTION("a knob list that does not match its count") {
    text = replaced(json, "\"knob_count\": 2", "\"knob_count\": 1");
    reason = "knobs where knob_count is 1";
  }
  SECTION("a position in heuristics' list that cannot be") {
    text = replaced(json, "\"heuristic_index\": -1", "\"heuristic_index\": -2");
    reason = "heuristic position -2";
  }
  SECTION("a negative time") {
    text = replaced(json, "\"time_ms\": 0.25", "\"time_ms\": -0.25");
    reason = "time -0.25";
  }
  SECTION("numerical notes that cannot be") {
    text = replaced(json, "\"numerical_notes\": 0", "\"numerical_notes\": -7");
    reason = "numerical notes -7";
  }
  // What deserialize refuses must be refused here too, or an import makes a file that cannot be saved.
  SECTION("graph-API entries in format 1") {
    text = replaced(json, kCurrent, "\"format_version\": 1");
    reason = "format_version 1 cannot hold graph-API entries";
  }
  SECTION("pending keys out of order") {
    const Checkpoint unordered = [] {
      Checkpoint checkpoint = sample();
      std::swap(checkpoint.sections[0].pending_graph[0], checkpoint.sections[0].pending_graph[1]);
      return checkpoint;
    }();
    text = to_json(unordered);
    reason = "pending_graph key 1 is out of order or repeated";
  }
  SECTION("pending keys in format 3") {
    text = replaced(json, kCurrent, "\"format_version\": 3");
    reason = "unknown field 'sections[0].pending_graph'";
  }
  SECTION("stored plans in format 2") {
    text = replaced(json, kCurrent, "\"format_version\": 2");
    reason = "format_version 2 cannot hold stored plans";
  }
  SECTION("a device name longer than a file may hold") {
    text = replaced(json, "\"cudnn_cache synthetic GPU\"", "\"" + std::string(300, 'x') + "\"");
    reason = "device name of 300 bytes";
  }
  // rapidjson's full-precision parser read out of bounds on this number (the fuzzer); the ASan run shows it does not.
  SECTION("a number with a zero significand and an exponent") {
    text = replaced(json, kCurrent, "\"format_version\": 0E190");
    reason = "not a valid cudnn_cache JSON export";
  }
  SECTION("a device name with a control character") {
    text = replaced(json, "\"cudnn_cache synthetic GPU\"", "\"GPU\\u0001\"");
    reason = "device name that is not printable ASCII";
  }
  // Note [Reading a JSON export]: where it was, which field, what was expected; none of cereal's or RapidJSON's
  // own words.
  SECTION("a top level that is not an object") {
    text = "[1, 2]";
    reason = "it must be one object";
  }
  SECTION("a missing field") {
    text = replaced(json, "\"algorithm\": 1,", "");
    reason = "missing field 'algorithm'";
  }
  SECTION("a field of the wrong type, named with where it is") {
    text = replaced(json, "\"workspace_bytes\": ", "\"workspace_bytes\": \"many\", \"was\": ");
    reason = "at sections[0].legacy_forward[";
  }
  SECTION("a string where a number belongs") {
    text = replaced(json, kCurrent, "\"format_version\": \"4\"");
    reason = "field 'format_version' must be a number of its field's kind";
  }
  SECTION("a number where an array belongs") {
    text = replaced(json, "\"stored_plans\": [", "\"stored_plans\": 5, \"was\": [");
    reason = "at sections[0]: field 'stored_plans' must be an object or an array";
  }
  SECTION("a field the reader does not know") {
    text = replaced(json, "\"time_ms\": 0.25", "\"time_ms\": 0.25, \"tme_ms\": 0.5");
    reason = "unknown field 'sections[0].graph_forward[";
  }
  SECTION("a field the reader does not know, at the top") {
    text = replaced(json, kCurrent, std::string(kCurrent) + ", \"comment\": \"tuned on h200-07\"");
    reason = "unknown field 'comment'";
  }
  CAPTURE(reason);
  const std::string message = error_of([&] { from_json(text, "edited.json"); });
  CHECK_THAT(message, Contains("'edited.json'") && Contains(reason));
  CHECK_THAT(message, !Contains("rapidjson") && !Contains("NVP") && !Contains("Flag"));
}

TEST_CASE("diff tells entries of one side, entries of both with another best, and the same ones", "[report]") {
  const Checkpoint a = sample();
  CHECK(diff(a, a).identical());
  CHECK(diff(a, a).same == a.size());

  CacheStore changed;
  merge_into(changed, a);
  DirectionCaches& caches = changed.caches(synthetic_origin());
  caches.graph_forward.insert(conv_key(Direction::forward, 5),
                              Ranking<GraphForwardTraits>::of({engine(4, 0.125f)}));  // a new best
  caches.backward_filter.insert(conv_key(Direction::backward_filter, 7),
                                Ranking<BackwardFilterTraits>::of({candidate<BackwardFilterTraits>(2, 1.0f)}));
  const CheckpointDiff result = diff(a, snapshot(changed));
  REQUIRE(result.different_best.size() == 1);
  CHECK(result.different_best[0].cache == "graph forward");
  CHECK_THAT(result.different_best[0].first, Contains("engine 9"));
  CHECK_THAT(result.different_best[0].second, Contains("engine 4"));
  REQUIRE(result.only_second.size() == 1);
  CHECK(result.only_second[0].cache == "legacy backward_filter");
  CHECK(result.only_first.empty());
  CHECK(result.same == a.size() - 1);
  CHECK_THAT(difference_lines(result.different_best)[0], Contains("graph forward on") && Contains(" | "));

  const CheckpointDiff reverse = diff(snapshot(changed), a);
  CHECK(reverse.only_first.size() == 1);
  CHECK(reverse.only_second.empty());
}

TEST_CASE("merge keeps the faster best and reports keys whose best differ", "[report]") {
  const ConvolutionKey key = conv_key(Direction::forward, 2);
  auto checkpoint_with = [&](const EngineCandidate& best, int batch_of_other) {
    CacheStore store;
    DirectionCaches& caches = store.caches(synthetic_origin());
    caches.graph_forward.insert(key, Ranking<GraphForwardTraits>::of({best}));
    caches.forward.insert(conv_key(Direction::forward, batch_of_other),
                          Ranking<ForwardTraits>::of({candidate<ForwardTraits>(0, 1.0f)}));
    return snapshot(store);
  };
  const Checkpoint slow = checkpoint_with(engine(3, 2.0f), 10);
  const Checkpoint fast = checkpoint_with(engine(8, 1.0f), 11);
  for (const bool fast_first : {false, true}) {
    const MergeResult result = fast_first ? merge({fast, slow}) : merge({slow, fast});
    REQUIRE(result.conflicts.size() == 1);
    CHECK(result.conflicts[0].key == key);
    CHECK(result.merged.size() == 3);
    const auto& merged = result.merged.sections.at(0).graph_forward;
    REQUIRE(merged.size() == 1);
    CHECK(merged[0].second.front().engine_id == 8);  // the faster one, whichever came first
    CHECK(merged[0].second.size() == 2);             // and the other as runner-up
  }
  CHECK(merge({slow, slow}).conflicts.empty());
}

TEST_CASE("summary, entry table and statistics say what a file holds", "[report]") {
  const Checkpoint checkpoint = sample();
  CHECK_THAT(summary(checkpoint), Contains(std::to_string(checkpoint.size()) + " entries for 1 device/cuDNN origin") &&
                                      Contains("1 stored plans"));
  const std::string table = entry_table(checkpoint);
  CHECK_THAT(table, Contains("direction") && Contains("graph") && Contains("legacy") && Contains("engine 9"));
  CHECK(std::count(table.begin(), table.end(), '\n') == static_cast<long>(checkpoint.size()) + 2);
  CHECK_THAT(statistics(checkpoint), Contains("graph forward") && Contains("stored plans 1 (7 B)"));
}
