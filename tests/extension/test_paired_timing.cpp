// Note [Never slower than native's pick]: which of native's two picks is the reference, the sign test that
// decides whether a challenger leads it, and the times a search's configs get from their paired rounds.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cudnn_cache/perf_cache.h"
#include "paired_timing.h"

using namespace cudnn_cache;

namespace {

EngineCandidate config(std::int64_t engine, float time_ms, std::uint64_t workspace = 0) {
  EngineCandidate candidate;
  candidate.engine_id = engine;
  candidate.time_ms = time_ms;
  candidate.workspace_bytes = workspace;
  return candidate;
}

// The engines of `configs` in the order a ranking of them holds.
std::vector<std::int64_t> ranked_engines(const std::vector<EngineCandidate>& configs) {
  std::vector<std::int64_t> engines;
  for (const EngineCandidate& candidate : Ranking<GraphForwardTraits>::of(configs.begin(), configs.end())) {
    engines.push_back(candidate.engine_id);
  }
  return engines;
}

float after(float ms) { return std::nextafter(ms, std::numeric_limits<float>::infinity()); }

}  // namespace

TEST_CASE("the sign test shows a median below 1 only with enough rounds below 1", "[paired_timing]") {
  CHECK_FALSE(median_below_one({}));
  CHECK_FALSE(median_below_one({0.5f, 0.5f, 0.5f, 0.5f}));        // 4 rounds cannot show it at 95%
  CHECK(median_below_one({0.9f, 0.8f, 0.95f, 0.9f, 0.99f}));       // 5 of 5
  CHECK(median_below_one({0.9f, 0.8f, 0.95f, 0.9f, 0.99f, 0.97f, 0.9f}));
  CHECK_FALSE(median_below_one({0.9f, 0.8f, 0.95f, 0.9f, 0.99f, 0.97f, 1.01f}));  // 7 rounds: every one
  CHECK_FALSE(median_below_one({0.9f, 0.8f, 0.95f, 0.9f, 1.0f, 0.97f, 0.9f}));    // a tie is not faster
  // 10 rounds: all but one below
  std::vector<float> ten(10, 0.97f);
  ten[3] = 1.2f;
  CHECK(median_below_one(ten));
  ten[6] = 1.1f;
  CHECK_FALSE(median_below_one(ten));
}

TEST_CASE("more rounds are timed only while a challenger is faster in the median but not shown faster",
          "[paired_timing]") {
  const std::vector<float> native{1.00f, 1.02f, 0.98f, 1.00f, 1.01f, 0.99f, 1.00f};
  // 3% faster in 6 of 7 rounds: faster in the median, not shown by 7 rounds; more rounds may show it.
  const std::vector<float> close{0.97f, 0.99f, 0.95f, 0.97f, 1.02f, 0.96f, 0.97f};
  CHECK(challenger_undecided({native, close}, 0));
  CHECK(challenger_undecided({close, native}, 1));  // native's pick at any position
  // Faster in every round: decided. Slower in the median: decided (native's pick stays).
  const std::vector<float> faster{0.90f, 0.91f, 0.89f, 0.92f, 0.90f, 0.88f, 0.90f};
  const std::vector<float> slower{1.03f, 1.05f, 0.99f, 1.02f, 1.04f, 1.00f, 1.03f};
  CHECK_FALSE(challenger_undecided({native, faster}, 0));
  CHECK_FALSE(challenger_undecided({native, slower}, 0));
  CHECK_FALSE(challenger_undecided({native, faster, slower}, 0));
  CHECK(challenger_undecided({native, faster, close}, 0));
  // 14 rounds of the close one (11 or more of 14 below 1 shows it): decided.
  std::vector<float> native14 = native, close14 = close;
  native14.insert(native14.end(), native.begin(), native.end());
  close14.insert(close14.end(), close.begin(), close.end());
  CHECK_FALSE(challenger_undecided({native14, close14}, 0));
  CHECK(median_below_one(std::vector<float>{0.97f, 0.99f, 0.95f, 0.97f, 1.02f, 0.96f, 0.97f, 0.97f, 0.99f, 0.95f,
                                            0.97f, 1.02f, 0.96f, 0.97f}));
}

TEST_CASE("a challenger faster in the paired rounds leads native's pick, at native's time times its ratio",
          "[paired_timing]") {
  // Position 0 is heuristics' first pick (native's); 1 and 2 are challengers, 3 a slower config not in the rounds.
  std::vector<EngineCandidate> configs{config(10, 1.00f), config(20, 0.90f), config(30, 0.95f), config(40, 1.30f)};
  const std::vector<std::vector<float>> rounds{
      {1.00f, 1.02f, 0.98f, 1.00f, 1.01f, 0.99f, 1.00f},   // native's pick
      {0.90f, 0.91f, 0.89f, 0.92f, 0.90f, 0.88f, 0.90f},   // faster in every round
      {0.97f, 1.03f, 0.96f, 0.99f, 1.00f, 0.98f, 0.97f}};  // within the noise
  settle_against_native(configs, 0, {0, 1, 2}, rounds);
  CHECK(configs[0].time_ms == 1.00f);                                     // native's median
  CHECK(configs[1].time_ms == Approx(1.00f * (0.90f / 1.00f)).epsilon(1e-6));  // native's x the median ratio
  CHECK(configs[2].time_ms == after(1.00f));  // its own median, 0.98, is not shown faster: one step behind
  CHECK(configs[3].time_ms == 1.30f);         // slower than native's pick already: as measured
  CHECK(ranked_engines(configs) == std::vector<std::int64_t>{20, 10, 30, 40});
}

TEST_CASE("without a challenger shown faster, native's pick ranks first, whatever the first pass said",
          "[paired_timing]") {
  // The first pass had the challenger at 0.80 ms and an unpaired config at 0.85 ms, both ahead of native's
  // 1.00 ms; the rounds do not bear the challenger out, and the other config was never paired.
  std::vector<EngineCandidate> configs{config(10, 1.00f, 1 << 20), config(20, 0.80f), config(30, 0.85f),
                                       config(40, 1.10f)};
  const std::vector<std::vector<float>> rounds{{1.00f, 1.00f, 1.00f, 1.00f, 1.00f, 1.00f, 1.00f},
                                               {0.99f, 1.01f, 0.99f, 1.01f, 0.99f, 1.01f, 0.99f}};
  settle_against_native(configs, 0, {0, 1}, rounds);
  CHECK(configs[1].time_ms == after(1.00f));
  CHECK(configs[2].time_ms == after(1.00f));  // no paired evidence: behind native's pick
  CHECK(configs[3].time_ms == 1.10f);
  // Native's pick leads even with the largest workspace: nothing is tied with it.
  CHECK(ranked_engines(configs).front() == 10);
}

TEST_CASE("among challengers faster than native's pick, near-ties go to the one timed first", "[paired_timing]") {
  // Native's pick (position 0), then challengers in the order the search timed them. 1 and 2 both beat native
  // in every round and are within each other's noise; 2 has the lower median ratio in this run.
  std::vector<EngineCandidate> configs{config(10, 1.00f), config(20, 0.90f), config(30, 0.89f)};
  const std::vector<std::vector<float>> tied{
      {1.00f, 1.00f, 1.00f, 1.00f, 1.00f, 1.00f, 1.00f},
      {0.90f, 0.88f, 0.91f, 0.89f, 0.90f, 0.92f, 0.90f},
      {0.89f, 0.90f, 0.88f, 0.90f, 0.88f, 0.91f, 0.89f}};
  settle_against_native(configs, 0, {0, 1, 2}, tied);
  CHECK(ranked_engines(configs) == std::vector<std::int64_t>{20, 30, 10});
  CHECK(configs[1].time_ms == Approx(0.90f).epsilon(1e-6));  // the leader: native's time x its median ratio
  CHECK(configs[2].time_ms == after(configs[1].time_ms));   // its 0.89 is not shown faster than the leader's
  // Listed in another order, the same rounds give the same leader: the order is the search's, not the list's.
  std::vector<EngineCandidate> again{config(10, 1.00f), config(20, 0.90f), config(30, 0.89f)};
  settle_against_native(again, 0, {2, 0, 1}, {tied[2], tied[0], tied[1]});
  CHECK(ranked_engines(again) == std::vector<std::int64_t>{20, 30, 10});

  // A later challenger shown faster than the leader so far (in every round) takes the lead.
  std::vector<EngineCandidate> clear{config(10, 1.00f), config(20, 0.90f), config(30, 0.80f)};
  settle_against_native(clear, 0, {0, 1, 2},
                        {tied[0], tied[1], {0.80f, 0.79f, 0.81f, 0.80f, 0.78f, 0.80f, 0.81f}});
  CHECK(ranked_engines(clear) == std::vector<std::int64_t>{30, 20, 10});
  CHECK(clear[2].time_ms == Approx(0.80f).epsilon(1e-6));
  CHECK(clear[1].time_ms == Approx(0.90f).epsilon(1e-6));  // its own estimate, behind the leader's already
}

TEST_CASE("the reference is the faster of native's two picks in the median of their paired rounds",
          "[paired_timing]") {
  const std::vector<float> heuristic{1.000f, 1.004f, 0.998f, 1.001f, 1.003f, 0.999f, 1.002f};
  // Benchmark mode's pick 0.25% faster in the median, within the noise of a round (slower in 2 of 7): the sign
  // test would not show it faster, yet it is what native benchmark=True runs, and the faster of the two.
  const std::vector<float> benchmark{0.9975f, 1.0050f, 0.9950f, 0.9985f, 1.0040f, 0.9965f, 0.9995f};
  std::vector<float> ratios;
  for (std::size_t r = 0; r < heuristic.size(); ++r) ratios.push_back(benchmark[r] / heuristic[r]);
  REQUIRE_FALSE(median_below_one(ratios));
  CHECK(native_reference({heuristic, benchmark}, 0, 1) == 1);
  CHECK(native_reference({benchmark, heuristic}, 1, 0) == 0);  // positions, not order
  // Slower, or the same in the median: heuristics' pick.
  CHECK(native_reference({benchmark, heuristic}, 0, 1) == 0);
  CHECK(native_reference({heuristic, heuristic}, 0, 1) == 0);
  // One config for both.
  CHECK(native_reference({heuristic}, 0, 0) == 0);
  CHECK_THROWS_WITH(native_reference({heuristic}, 0, 1), Catch::Contains("native's picks at 0 and 1 of 1"));

  // Settled against it: benchmark's pick first; a config faster than heuristics' pick but not shown faster than
  // benchmark's, and heuristics' pick, behind it at their own medians.
  std::vector<EngineCandidate> configs{config(10, 1.00f), config(20, 0.99f), config(30, 0.995f)};
  const std::vector<float> between{0.9990f, 1.0030f, 0.9970f, 0.9990f, 1.0030f, 0.9980f, 1.0000f};
  const std::vector<std::vector<float>> rounds{heuristic, benchmark, between};
  const std::size_t reference = native_reference(rounds, 0, 1);
  settle_against_native(configs, reference, {0, 1, 2}, rounds);
  CHECK(ranked_engines(configs) == std::vector<std::int64_t>{20, 30, 10});
  CHECK(configs[1].time_ms == 0.9985f);  // the reference's median
  CHECK(configs[2].time_ms == 0.9990f);
  CHECK(configs[0].time_ms == 1.0010f);
  // More rounds are judged against the reference: `between` is faster than heuristics' pick in the median,
  // not than benchmark's.
  CHECK(challenger_undecided({heuristic, between}, 0));
  CHECK_FALSE(challenger_undecided(rounds, reference));
}

TEST_CASE("benchmark mode's near-ties are the configs of its ten within the band of its pick, fastest first",
          "[paired_timing]") {
  // The first pass of ResNet-18's backward-filter key as it may have gone: the pick (position 4) 32.0 us, the
  // config the audit later found faster (position 7) 33.5 us, 4.7% behind it and outside the fastest three.
  const std::vector<float> first_pass{0.0400f, 0.0330f, 0.0500f, 0.0328f, 0.0320f, 0.0380f, 0.0900f, 0.0335f};
  CHECK(benchmark_near_ties(first_pass, kBenchmarkNearTie, kBenchmarkNearTies) ==
        std::vector<std::size_t>{3, 1, 7});
  CHECK(benchmark_near_ties(first_pass, kBenchmarkNearTie, 2) == std::vector<std::size_t>{3, 1});
  CHECK(benchmark_near_ties(first_pass, 1.035f, kBenchmarkNearTies) == std::vector<std::size_t>{3, 1});
  CHECK(benchmark_near_ties(first_pass, 1.0f, kBenchmarkNearTies).empty());
  // On a tie with the pick, the earlier stands for the pick (as time_heuristics picks) and the later is a tie.
  CHECK(benchmark_near_ties({0.5f, 0.5f, 0.6f}, 1.1f, 3) == std::vector<std::size_t>{1});
  CHECK(benchmark_near_ties({0.5f}, 1.1f, 3).empty());
  CHECK(benchmark_near_ties({}, 1.1f, 3).empty());

  // Timed in the rounds as a challenger, the near-tie leads only where they show it faster than the reference.
  const std::vector<float> pick{1.00f, 1.01f, 0.99f, 1.00f, 1.02f, 1.00f, 0.99f};
  const std::vector<float> faster{0.955f, 0.96f, 0.95f, 0.955f, 0.97f, 0.955f, 0.945f};
  std::vector<EngineCandidate> configs{config(33, 1.00f), config(65, 1.04f)};
  settle_against_native(configs, 0, {0, 1}, {pick, faster});
  CHECK(ranked_engines(configs) == std::vector<std::int64_t>{65, 33});
  std::vector<float> within_noise = faster;
  within_noise[2] = 1.00f;  // slower in one round of seven: not shown faster
  configs = {config(33, 1.00f), config(65, 1.04f)};
  settle_against_native(configs, 0, {0, 1}, {pick, within_noise});
  CHECK(ranked_engines(configs) == std::vector<std::int64_t>{33, 65});
}

TEST_CASE("a challenger leads the faster native pick only where the rounds show it faster than that one",
          "[paired_timing]") {
  const std::vector<float> heuristic{1.00f, 1.00f, 1.00f, 1.00f, 1.00f, 1.00f, 1.00f};
  const std::vector<float> benchmark{0.90f, 0.91f, 0.89f, 0.90f, 0.90f, 0.91f, 0.90f};
  // Faster than heuristics' pick in every round; within benchmark's noise.
  const std::vector<float> close{0.89f, 0.92f, 0.90f, 0.89f, 0.91f, 0.90f, 0.89f};
  std::vector<EngineCandidate> configs{config(10, 1.00f), config(20, 0.90f), config(30, 0.88f)};
  std::vector<std::vector<float>> rounds{heuristic, benchmark, close};
  settle_against_native(configs, native_reference(rounds, 0, 1), {0, 1, 2}, rounds);
  CHECK(ranked_engines(configs) == std::vector<std::int64_t>{20, 30, 10});
  // Shown faster than benchmark's pick too (every round): it leads.
  std::vector<EngineCandidate> again{config(10, 1.00f), config(20, 0.90f), config(30, 0.88f)};
  rounds[2] = {0.85f, 0.86f, 0.84f, 0.85f, 0.85f, 0.86f, 0.85f};
  settle_against_native(again, native_reference(rounds, 0, 1), {0, 1, 2}, rounds);
  CHECK(ranked_engines(again) == std::vector<std::int64_t>{30, 20, 10});
}

TEST_CASE("settling refuses rounds that do not match the finalists", "[paired_timing]") {
  std::vector<EngineCandidate> configs{config(10, 1.0f), config(20, 0.9f)};
  CHECK_THROWS_WITH(settle_against_native(configs, 0, {1}, {{0.9f}}),
                    Catch::Contains("native's pick was not timed"));
  CHECK_THROWS_WITH(settle_against_native(configs, 0, {0, 1}, {{1.0f, 1.0f}, {0.9f}}),
                    Catch::Contains("finalist 1 has 1 rounds, native's pick 2"));
  CHECK_THROWS_WITH(settle_against_native(configs, 0, {0, 1}, {{1.0f}}), Catch::Contains("2 finalists for 1 rounds"));
}

namespace {

// An audit's choice: the config and its time in each round (the median is the audit's time).
ChoiceAudit::Choice audited(std::int64_t engine, std::vector<float> rounds) {
  ChoiceAudit::Choice choice;
  choice.config = config(engine, 0.0f);
  choice.round_ms = std::move(rounds);
  std::vector<float> sorted = choice.round_ms;
  std::sort(sorted.begin(), sorted.end());
  choice.time_ms = choice.config.time_ms = sorted[sorted.size() / 2];
  return choice;
}

ChoiceAudit audit_of(ChoiceAudit::Choice stored, ChoiceAudit::Choice heuristic, ChoiceAudit::Choice benchmark) {
  ChoiceAudit audit;
  audit.stored = std::move(stored);
  audit.heuristic = std::move(heuristic);
  audit.benchmark = std::move(benchmark);
  return audit;
}

const std::vector<float> kSteady{0.012f, 0.0121f, 0.0119f, 0.012f, 0.0122f, 0.012f, 0.0121f};

std::vector<float> times(const std::vector<float>& rounds, float ratio) {
  std::vector<float> scaled;
  for (float ms : rounds) scaled.push_back(ms * ratio);
  return scaled;
}

}  // namespace

TEST_CASE("settling by an audit lets a native pick take a stored config's place only where the rounds show it faster",
          "[paired_timing][settle]") {
  // RegNetY's 52 -> 440 SE forward key (H100, 2026-12-06): the search stored benchmark mode's pick (engine 28) at
  // 15.4 us under the tuning step's load; in steady state heuristics' pick (engine 58) was 6% faster.
  const std::vector<EngineCandidate> ranking{config(28, 0.0154f), config(70, 0.0161f), config(58, 0.0173f)};
  const ChoiceAudit audit =
      audit_of(audited(28, times(kSteady, 1.065f)), audited(58, kSteady), audited(70, times(kSteady, 1.14f)));
  const std::vector<EngineCandidate> settled = settle_by_audit(ranking, audit);
  REQUIRE(settled.size() == 3);
  CHECK(ranked_engines(settled) == std::vector<std::int64_t>{58, 28, 70});
  CHECK(settled[0].time_ms == audit.stored.time_ms);  // the reference: its median in the audit's rounds
  CHECK(settled[2].time_ms == Approx(audit.stored.time_ms / 1.065f).epsilon(1e-5));  // x its median ratio
  // A native pick within the stored config's noise (faster in the median, not in enough rounds) does not take
  // its place: RegNetY's grouped backward-filter key, engines 23 and 20 tied alone, and engine 20 cost the
  // network's step 1.9 ms of GPU time.
  std::vector<float> close = times(kSteady, 0.99f);
  close[1] = close[4] = 0.0125f;
  const ChoiceAudit near = audit_of(audited(28, kSteady), audited(58, close), audited(70, times(kSteady, 1.14f)));
  const std::vector<EngineCandidate> kept = settle_by_audit(ranking, near);
  CHECK(ranked_engines(kept).front() == 28);
  CHECK(kept[0].time_ms == near.stored.time_ms);
  // Of two native picks shown faster, the one first in the ranking leads unless the other is shown faster than it.
  const ChoiceAudit both =
      audit_of(audited(28, times(kSteady, 1.2f)), audited(58, times(kSteady, 1.01f)), audited(70, kSteady));
  CHECK(ranked_engines(settle_by_audit(ranking, both)) == std::vector<std::int64_t>{70, 58, 28});
}

TEST_CASE("settling by an audit: a native pick the ranking lacks joins it, and native's own pick stays",
          "[paired_timing][settle]") {
  const std::vector<EngineCandidate> ranking{config(58, 0.014f), config(70, 0.015f)};
  // Benchmark mode's pick in the audit, engine 63, is not in the ranking and is faster in every round.
  const ChoiceAudit missing =
      audit_of(audited(58, kSteady), audited(58, kSteady), audited(63, times(kSteady, 0.95f)));
  const std::vector<EngineCandidate> joined = settle_by_audit(ranking, missing);
  REQUIRE(joined.size() == 3);
  CHECK(ranked_engines(joined) == std::vector<std::int64_t>{63, 58, 70});
  // The stored config is native's pick in both modes: nothing to settle, the ranking comes back as it was.
  const ChoiceAudit native = audit_of(audited(58, kSteady), audited(58, kSteady), audited(58, kSteady));
  CHECK(settle_by_audit(ranking, native) == ranking);
  // Rounds that do not match are an error, not a guess.
  const ChoiceAudit short_rounds =
      audit_of(audited(58, kSteady), audited(70, {0.01f, 0.01f}), audited(70, {0.01f, 0.01f}));
  CHECK_THROWS_WITH(settle_by_audit(ranking, short_rounds), Catch::Contains("has 2 rounds, the stored config 7"));
  CHECK_THROWS_WITH(settle_by_audit({}, native), Catch::Contains("settle_by_audit: 0 configs"));
}

namespace {

EngineCandidate deterministic_config(std::int64_t engine, float time_ms) {
  EngineCandidate candidate = config(engine, time_ms);
  candidate.numerical_notes = 0;
  return candidate;
}

}  // namespace

TEST_CASE("a deterministic config ranks before native's deterministic pick only where the rounds show it faster",
          "[paired_timing][deterministic]") {
  const std::vector<float> reference{1.10f, 1.11f, 1.09f, 1.10f, 1.12f, 1.10f, 1.10f};
  const std::vector<float> faster{1.00f, 1.01f, 0.99f, 1.00f, 1.02f, 1.00f, 1.00f};  // in every round
  const std::vector<float> luckier{1.00f, 1.01f, 0.99f, 1.00f, 1.20f, 1.00f, 1.00f};  // in 6 of 7
  const std::vector<float> split{0.90f, 0.91f, 0.89f, 0.90f, 0.92f, 0.90f, 0.90f};
  for (const bool shown : {true, false}) {
    CAPTURE(shown);
    // 1: non-deterministic, the fastest; 2: deterministic, faster than native's deterministic pick (3) in the
    // rounds or only in the median; 4: deterministic, fast in the first pass, not a finalist; 5: slower.
    std::vector<EngineCandidate> configs{config(1, 0.90f), deterministic_config(2, 1.00f),
                                         deterministic_config(3, 1.10f), deterministic_config(4, 1.05f),
                                         deterministic_config(5, 1.30f)};
    settle_deterministic(configs, 2, {0, 1, 2}, {split, shown ? faster : luckier, reference});
    CHECK(configs[0].time_ms == 0.90f);  // non-deterministic configs keep their place
    CHECK(configs[1].time_ms == (shown ? 1.00f : after(1.10f)));
    CHECK(configs[2].time_ms == 1.10f);
    CHECK(configs[3].time_ms == after(1.10f));  // no paired evidence: behind native's pick
    CHECK(configs[4].time_ms == 1.30f);
    // The first deterministic config of the ranking is what a deterministic call runs.
    std::vector<std::int64_t> deterministic;
    for (std::int64_t engine : ranked_engines(configs)) {
      if (engine != 1) deterministic.push_back(engine);
    }
    CHECK(deterministic.front() == (shown ? 2 : 3));
  }
  std::vector<EngineCandidate> configs{config(1, 1.0f), deterministic_config(2, 0.9f)};
  CHECK_THROWS_WITH(settle_deterministic(configs, 0, {0, 1}, {reference, faster}),
                    Catch::Contains("the reference is not deterministic"));
  CHECK_THROWS_WITH(settle_deterministic(configs, 1, {0, 1}, {reference}), Catch::Contains("2 finalists for 1 rounds"));
}

TEST_CASE("each round times its configs in a fresh order, the same in every run", "[paired_timing]") {
  // Note [Paired rounds in a fresh order]
  CHECK(round_order(0, 0).empty());
  CHECK(round_order(3, 1) == std::vector<std::size_t>{0});
  const std::size_t count = 4;  // the audit's: the stored config twice and native's two picks
  std::vector<std::vector<int>> at_position(count, std::vector<int>(count, 0));  // [config][position]
  std::set<std::pair<std::size_t, std::size_t>> followed;                       // (config, the one before it)
  std::set<std::vector<std::size_t>> orders;
  for (int round = 0; round < 21; ++round) {  // as many as a search's rounds may be
    const std::vector<std::size_t> order = round_order(round, count);
    CHECK(order == round_order(round, count));  // a function of the round alone
    std::vector<std::size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    REQUIRE(sorted == std::vector<std::size_t>{0, 1, 2, 3});  // each config once
    for (std::size_t position = 0; position < count; ++position) {
      ++at_position[order[position]][position];
      if (position > 0) followed.insert({order[position], order[position - 1]});
    }
    orders.insert(order);
  }
  CHECK(orders.size() > 8);  // not one order, nor a rotation of one (4 of those)
  for (std::size_t config = 0; config < count; ++config) {
    for (std::size_t position = 0; position < count; ++position) {
      CHECK(at_position[config][position] > 0);  // no config keeps a place
    }
  }
  CHECK(followed.size() == count * (count - 1));  // nor a neighbour: each follows every other
}

// What the debug log says of a search's rounds: enough to see, per key, why the stored config leads.
TEST_CASE("the rounds' description names the reference and, per challenger, its times, ratio and wins",
          "[paired_timing]") {
  // Heuristics' engine 63 (first pass 8 us), benchmark mode's engine 74 (first pass 9 us), and a challenger,
  // engine 20; seven rounds.
  const std::vector<EngineCandidate> finalists{config(63, 0.008f), config(74, 0.009f), config(20, 0.0095f)};
  const std::vector<std::vector<float>> rounds{
      std::vector<float>(7, 0.010f),                                     // heuristics' pick: 10 us every round
      std::vector<float>(7, 0.009f),                                     // benchmark mode's: 9 us, the faster
      {0.0085f, 0.0085f, 0.0085f, 0.0095f, 0.0085f, 0.0085f, 0.0085f}};  // faster than 9 us in 6 of 7
  const std::size_t reference = native_reference(rounds, 0, 1);
  REQUIRE(reference == 1);
  const std::string text = describe_rounds(finalists, rounds, 0, 1, reference);
  CHECK(text.rfind("7 paired rounds of 3 configs; the reference engine 74 (benchmark mode's pick), 9.00 us", 0) == 0);
  CHECK(text.find("; engine 63 (heuristics' pick): first pass 8.00 us, rounds 10.00 us, x1.111 of the reference, "
                  "faster in 0 of 7") != std::string::npos);
  // Faster in 6 rounds of 7: the sign test needs all 7, so not shown faster.
  CHECK(text.find("; engine 20: first pass 9.50 us, rounds 8.50 us, x0.944 of the reference, faster in 6 of 7") !=
        std::string::npos);
  CHECK(text.find("shown faster") == std::string::npos);
  // One config both modes pick, and a challenger faster in every round.
  const std::vector<std::vector<float>> decided{std::vector<float>(7, 0.010f), std::vector<float>(7, 0.008f)};
  const std::string shown = describe_rounds({config(63, 0.008f), config(20, 0.007f)}, decided, 0, 0, 0);
  CHECK(shown.rfind("7 paired rounds of 2 configs; the reference engine 63 (native's pick in both modes), 10.00 us",
                    0) == 0);
  CHECK(shown.find("engine 20: first pass 7.00 us, rounds 8.00 us, x0.800 of the reference, faster in 7 of 7, "
                   "shown faster") != std::string::npos);
  CHECK_THROWS(describe_rounds(finalists, decided, 0, 1, 1));  // rounds that do not match the finalists
}
