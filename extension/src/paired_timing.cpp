#include "paired_timing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <utility>

#include "cudnn_cache/error.h"
#include "graph_internal.h"

namespace cudnn_cache {
namespace {

// One float step behind `ms`: ranks after it, and differs from it by as little as a time can.
float just_after(float ms) { return std::nextafter(ms, std::numeric_limits<float>::infinity()); }

}  // namespace

std::vector<std::size_t> round_order(int round, std::size_t count) {
  std::vector<std::size_t> order(count);
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Fisher-Yates with splitmix64, written out: std::shuffle's draws differ between standard libraries.
  std::uint64_t state = 0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(round) + 1);
  const auto next = [&state] {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (std::size_t i = count; i > 1; --i) std::swap(order[i - 1], order[next() % i]);
  return order;
}

bool median_below_one(std::vector<float> ratios) {
  // The k-th largest of n values bounds the median from above with confidence 1 - P(Binomial(n, 1/2) < k): the
  // median is above it only if fewer than k values are. Take the largest k whose bound holds with 95%.
  const std::size_t n = ratios.size();
  double below = 0.0;      // P(B < k), growing with k
  double choose = 1.0;     // C(n, k - 1)
  const double all = std::ldexp(1.0, static_cast<int>(n));  // 2^n
  std::size_t k = 0;
  for (std::size_t next = 1; next <= n; ++next) {
    below += choose / all;  // adds P(B = next - 1)
    if (below > 0.05) break;
    k = next;
    choose = choose * static_cast<double>(n - next + 1) / static_cast<double>(next);
  }
  if (k == 0) return false;
  std::sort(ratios.begin(), ratios.end());
  return ratios[n - k] < 1.0f;
}

namespace {

// Per-round ratios of finalist a's time to finalist b's.
std::vector<float> round_ratios(const std::vector<std::vector<float>>& rounds, std::size_t a, std::size_t b) {
  std::vector<float> result(std::min(rounds[a].size(), rounds[b].size()));
  for (std::size_t r = 0; r < result.size(); ++r) result[r] = rounds[a][r] / rounds[b][r];
  return result;
}

}  // namespace

std::vector<std::size_t> benchmark_near_ties(const std::vector<float>& first_pass_ms, float band, std::size_t most) {
  std::vector<std::size_t> order(first_pass_ms.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return first_pass_ms[a] < first_pass_ms[b]; });
  std::vector<std::size_t> ties;
  for (std::size_t i = 1; i < order.size() && ties.size() < most; ++i) {
    if (!(first_pass_ms[order[i]] <= band * first_pass_ms[order.front()])) break;
    ties.push_back(order[i]);
  }
  return ties;
}

std::size_t native_reference(const std::vector<std::vector<float>>& rounds, std::size_t heuristic,
                             std::size_t benchmark) {
  CUDNN_CACHE_REQUIRE(heuristic < rounds.size() && benchmark < rounds.size(), "native_reference: native's picks at ",
                      heuristic, " and ", benchmark, " of ", rounds.size(), " finalists");
  if (benchmark == heuristic || rounds[benchmark].empty()) return heuristic;
  return graph_internal::median(round_ratios(rounds, benchmark, heuristic)) < 1.0f ? benchmark : heuristic;
}

std::string describe_rounds(const std::vector<EngineCandidate>& finalists,
                            const std::vector<std::vector<float>>& rounds, std::size_t heuristic,
                            std::size_t benchmark, std::size_t reference) {
  CUDNN_CACHE_REQUIRE(finalists.size() == rounds.size() && reference < rounds.size() && heuristic < rounds.size() &&
                          benchmark < rounds.size(),
                      "describe_rounds: ", finalists.size(), " finalists for ", rounds.size(),
                      " rounds, native's picks at ", heuristic, " and ", benchmark, ", the reference at ", reference);
  const auto us = [](float ms) {
    std::ostringstream out;
    out << std::fixed << std::setprecision(2) << ms * 1000.0f << " us";
    return out.str();
  };
  const auto role = [&](std::size_t f) -> std::string {
    if (f == heuristic && f == benchmark) return " (native's pick in both modes)";
    if (f == heuristic) return " (heuristics' pick)";
    if (f == benchmark) return " (benchmark mode's pick)";
    return "";
  };
  std::ostringstream out;
  out << rounds[reference].size() << " paired rounds of " << finalists.size() << " configs; the reference "
      << to_string(finalists[reference]) << role(reference) << ", " << us(graph_internal::median(rounds[reference]));
  for (std::size_t f = 0; f < finalists.size(); ++f) {
    if (f == reference || rounds[f].empty()) continue;
    const std::vector<float> to_reference = round_ratios(rounds, f, reference);
    const auto faster = std::count_if(to_reference.begin(), to_reference.end(), [](float r) { return r < 1.0f; });
    out << "; " << to_string(finalists[f]) << role(f) << ": first pass " << us(finalists[f].time_ms) << ", rounds "
        << us(graph_internal::median(rounds[f])) << ", x" << std::setprecision(3) << std::fixed
        << graph_internal::median(to_reference) << " of the reference, faster in " << faster << " of "
        << to_reference.size() << (median_below_one(to_reference) ? ", shown faster" : "");
  }
  return out.str();
}

bool challenger_undecided(const std::vector<std::vector<float>>& rounds, std::size_t native) {
  for (std::size_t f = 0; f < rounds.size(); ++f) {
    if (f == native || rounds[f].empty()) continue;
    const std::vector<float> to_native = round_ratios(rounds, f, native);
    if (graph_internal::median(to_native) < 1.0f && !median_below_one(to_native)) return true;
  }
  return false;
}

void settle_against_native(std::vector<EngineCandidate>& configs, std::size_t native,
                           const std::vector<std::size_t>& finalists, const std::vector<std::vector<float>>& rounds) {
  CUDNN_CACHE_REQUIRE(finalists.size() == rounds.size() && native < configs.size(), "settle_against_native: ",
                      finalists.size(), " finalists for ", rounds.size(), " rounds, native at ", native, " of ",
                      configs.size());
  const auto native_finalist = std::find(finalists.begin(), finalists.end(), native);
  CUDNN_CACHE_REQUIRE(native_finalist != finalists.end(), "settle_against_native: native's pick was not timed");
  const std::size_t native_f = static_cast<std::size_t>(native_finalist - finalists.begin());
  for (std::size_t f = 0; f < finalists.size(); ++f) {
    CUDNN_CACHE_REQUIRE(rounds[f].size() == rounds[native_f].size(), "settle_against_native: finalist ", f,
                        " has ", rounds[f].size(), " rounds, native's pick ", rounds[native_f].size());
  }
  const auto ratios = [&](std::size_t a, std::size_t b) { return round_ratios(rounds, a, b); };
  const float native_ms = graph_internal::median(rounds[native_f]);
  // Each finalist's paired estimate (native's time x its median ratio to native's pick), and whether the
  // rounds show it faster than native's pick.
  std::vector<float> estimate_ms(finalists.size(), native_ms);
  std::vector<bool> shown_faster(finalists.size(), false);
  std::vector<std::size_t> faster;  // those shown faster
  for (std::size_t f = 0; f < finalists.size(); ++f) {
    if (f == native_f) continue;
    const std::vector<float> to_native = ratios(f, native_f);
    estimate_ms[f] = native_ms * graph_internal::median(to_native);
    shown_faster[f] = median_below_one(to_native);
    if (shown_faster[f]) faster.push_back(f);
  }
  // The leader among them, in the order the search timed them (positions in configs): the first, unless a
  // later one is shown faster than the leader so far.
  std::sort(faster.begin(), faster.end(), [&](std::size_t a, std::size_t b) { return finalists[a] < finalists[b]; });
  std::optional<std::size_t> leader;
  for (std::size_t f : faster) {
    if (!leader || median_below_one(ratios(f, *leader))) leader = f;
  }
  const float leader_ms = leader ? estimate_ms[*leader] : native_ms;
  std::vector<bool> settled(configs.size(), false);
  for (std::size_t f = 0; f < finalists.size(); ++f) {
    EngineCandidate& config = configs[finalists[f]];
    settled[finalists[f]] = true;
    if (f == native_f || f == leader) {
      config.time_ms = estimate_ms[f];  // native's median; the leader's estimate
    } else if (shown_faster[f]) {  // faster than native's pick, not the leader
      config.time_ms = std::max(estimate_ms[f], just_after(leader_ms));
    } else {
      config.time_ms = std::max(graph_internal::median(rounds[f]), just_after(native_ms));
    }
  }
  for (std::size_t i = 0; i < configs.size(); ++i) {
    if (!settled[i] && configs[i].time_ms <= native_ms) configs[i].time_ms = just_after(native_ms);
  }
}

std::vector<EngineCandidate> settle_by_audit(std::vector<EngineCandidate> configs, const ChoiceAudit& audit) {
  CUDNN_CACHE_REQUIRE(!configs.empty() && !audit.stored.round_ms.empty(), "settle_by_audit: ", configs.size(),
                      " configs, ", audit.stored.round_ms.size(), " rounds of the stored one");
  std::vector<std::size_t> finalists{0};  // positions in configs: first the stored config, the ranking's first
  std::vector<std::vector<float>> rounds{audit.stored.round_ms};
  // The position in finalists of a native pick: the stored config's where it is that config.
  const auto finalist = [&](const ChoiceAudit::Choice& choice) -> std::size_t {
    if (choice.config.same_choice(audit.stored.config)) return 0;
    auto config = std::find_if(configs.begin(), configs.end(),
                               [&](const EngineCandidate& c) { return c.same_choice(choice.config); });
    if (config == configs.end()) config = configs.insert(configs.end(), choice.config);
    const std::size_t at = static_cast<std::size_t>(config - configs.begin());
    const auto known = std::find(finalists.begin(), finalists.end(), at);
    if (known != finalists.end()) return static_cast<std::size_t>(known - finalists.begin());
    CUDNN_CACHE_REQUIRE(choice.round_ms.size() == audit.stored.round_ms.size(), "settle_by_audit: ",
                        to_string(choice.config), " has ", choice.round_ms.size(), " rounds, the stored config ",
                        audit.stored.round_ms.size());
    finalists.push_back(at);
    rounds.push_back(choice.round_ms);
    return finalists.size() - 1;
  };
  finalist(audit.heuristic);
  finalist(audit.benchmark);
  if (finalists.size() == 1) return configs;  // the stored config is native's pick in both modes
  settle_against_native(configs, 0, finalists, rounds);  // the stored config is the reference here
  return configs;
}

void settle_deterministic(std::vector<EngineCandidate>& configs, std::size_t reference,
                          const std::vector<std::size_t>& finalists, const std::vector<std::vector<float>>& rounds) {
  CUDNN_CACHE_REQUIRE(finalists.size() == rounds.size() && reference < rounds.size(), "settle_deterministic: ",
                      finalists.size(), " finalists for ", rounds.size(), " rounds, the reference at ", reference);
  const EngineCandidate& native = configs[finalists[reference]];
  CUDNN_CACHE_REQUIRE(native.deterministic(), "settle_deterministic: the reference is not deterministic");
  const float native_ms = native.time_ms;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    EngineCandidate& config = configs[i];
    if (i == finalists[reference] || !config.deterministic() || !ranks_before<GraphForwardTraits>(config, native)) {
      continue;
    }
    const auto finalist = std::find(finalists.begin(), finalists.end(), i);
    const bool shown_faster =
        finalist != finalists.end() &&
        median_below_one(round_ratios(rounds, static_cast<std::size_t>(finalist - finalists.begin()), reference));
    if (!shown_faster) config.time_ms = just_after(native_ms);
  }
}

}  // namespace cudnn_cache
