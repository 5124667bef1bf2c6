#pragma once

// Note [Never slower than native's pick]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Native PyTorch has two picks for a key: heuristics' first config (benchmark=False) and benchmark mode's,
// the fastest of the first cudnn.benchmark_limit (10) configs of the same list, each timed once. A search's
// first step times that list in the same order (Note [Engine configs]), so both are among its configs: the
// first one timed, and the fastest of the first ten in the first pass. Its last step times its finalists and
// both native picks together, in interleaved rounds. The reference is the faster of native's two picks in the
// median of their per-round ratios (heuristics' on a tie): either is what native would run, and a stored choice
// must be no slower than the one a user would otherwise get at its best. Where the two differ by less than the
// noise of a round, the median still follows the faster one more often than not; a consistent 0.25% (as on a shape
// of the dynamic-shape benchmark, `python3 -m benchmarks dynamic`) is what a significance test between them would miss.
//
// A challenger takes the lead from the reference only when the rounds show it faster: the median of its
// per-round ratios to the reference is below 1 with 95% confidence (a sign test: distribution-free, so it holds
// for whatever noise the key has; with 7 rounds it means faster in every round, with 10 in all but one).
// Otherwise it is recorded as no faster than the reference, one float step behind it, and the reference stays
// first. So a stored choice is not slower than native's by chance, and near-ties between a challenger and
// native resolve to native's pick in every run and on every rank. Configs that were not in the rounds (slower in
// the first pass) have no paired evidence either, and go behind the reference too.
// Each round, as the first pass, times a call from an idle stream, the host's part with the GPU's (Note [Timing
// the whole call] in graph_internal.h): a challenger must be faster the way a step sees it.
//
// Benchmark mode's pick is itself a draw: it times each of its ten once, so of configs within each other's noise
// it runs whichever was luckier in that process. The first pass's fastest of the ten stands for it, but another
// timing (the audit's, a user's process) may pick a config the first pass put a few per cent behind, outside the
// fastest `finalists`: one that the rounds never timed and that had no chance to lead, though native might run it
// (ResNet-18's 1x1 stride-2 backward-filter key, H100 2026-12-05: the audit's benchmark pick, engine 65, 1.047x
// faster than the stored engine 33 in the audit's rounds). So the rounds also time benchmark mode's near-ties:
// the configs of its ten within kBenchmarkNearTie of the first pass's pick, at most kBenchmarkNearTies of them,
// as challengers (benchmark_near_ties). Each leads only where the rounds show it faster, as any challenger.
//
// Among the challengers shown faster, near-ties resolve the same way: in the order the search timed them
// (cuDNN's heuristic order first), the first leads unless a later one is shown faster than the leader so far,
// by the same test on their own per-round ratios. Which of two configs within each other's noise leads is then
// fixed by that order, not by which was luckier in this run, so two runs (or two ranks) store the same choice.
//
// The rounds go on while they cannot decide: where a challenger's median ratio to the reference is below 1 but
// the test does not show it yet, `repetitions` more rounds are timed, up to three times as many in all. A config
// a few per cent faster wins most rounds but seldom every one of 7, and 7 rounds alone left native's pick first
// on keys where native benchmark mode's pick was 2-4.5% faster (ResNet-50 fp32, the models benchmark's audit); with 14
// rounds the test needs 11 wins, with 21, 15. Keys whose challengers are clearly faster or clearly not pay
// nothing more.
//
// Times after the rounds: the reference gets the median of its rounds; the leader gets that times its median
// ratio to the reference (the paired estimate, below the reference's time); another challenger shown faster gets
// the later of its own estimate and one step behind the leader's; one not shown faster (the other native pick
// among them) gets the later of its own median and one step behind the reference's.
//
// A deterministic call runs the first deterministic config of the ranking (Note [Deterministic calls] in
// runtime.h), so the same holds among deterministic configs against native's deterministic picks: heuristics'
// first deterministic config (what native runs when deterministic) and the fastest deterministic one of the first
// pass (standing for benchmark mode's). The search of a deterministic call's miss (rank_deterministic) times them
// and the fastest deterministic config in the rounds too, and settle_deterministic then lets a deterministic
// config rank before the faster of those two (the deterministic reference) only where the rounds show it faster
// than that one; the rest go one step behind it.
// Settling only moves deterministic configs back, so it never makes a non-deterministic call's choice one the
// first settling did not show at least as fast.

// Note [Paired rounds in a fresh order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The rounds of the search's last step and of the audit time their configs in an order drawn anew each round,
// not in one fixed order. Where a round timed them in a fixed order, a config's position was part of its time:
// the audit timed the stored config first and again second, and over 327 audited keys of 2026-11-30 and
// 2026-12-05 (H200 and H100) its second timing was the faster in 60% of them (196; 164 expected, about 3.6
// standard deviations), by up to 3% in a workload's median; a plan run right after itself likely finds the
// host's caches (and the GPU's instruction caches) warm for it, which the flush of L2 before each run does not
// undo, and a key whose kernels take microseconds shows it. So the stored config's own two timings disagreed by
// more than noise (the audit's resolution), and whichever config a round timed first, or right after another,
// paid for its place. In a fresh order each round no config keeps a place or a neighbour; the order is a fixed
// function of the round's index, so the same rounds run in the same order in every run and on every rank (Note
// [Never slower than native's pick]: stable choices). The benchmarks' rounds do the same (benchmarks/measure.py, in_turn).

#include <cstddef>
#include <string>
#include <vector>

#include "cudnn_cache/graph.h"

namespace cudnn_cache {

// The order in which round `round` times `count` configs: a permutation of 0 .. count - 1 drawn from a
// generator seeded with the round's index alone (Note [Paired rounds in a fresh order]).
std::vector<std::size_t> round_order(int round, std::size_t count);

// Whether the median of `ratios` is below 1 with 95% confidence, by the sign test: false with fewer than 5
// values, which cannot show it.
bool median_below_one(std::vector<float> ratios);

// Benchmark mode's near-ties (Note [Never slower than native's pick]): the positions in `first_pass_ms` (the
// first-pass times of the configs benchmark mode times, its ten) whose time is within `band` (a ratio, e.g. 1.1)
// of the fastest, the fastest itself excluded, fastest first (the earlier on a tie), at most `most`.
constexpr float kBenchmarkNearTie = 1.10f;
constexpr std::size_t kBenchmarkNearTies = 3;
std::vector<std::size_t> benchmark_near_ties(const std::vector<float>& first_pass_ms, float band, std::size_t most);

// Of native's two picks, finalists `heuristic` and `benchmark` (positions in rounds; the same position when they
// are one config), the reference: `benchmark` where the median of its per-round ratios to `heuristic` is below
// 1, else `heuristic`. rounds[f][r] is finalist f's time in round r. See the Note.
std::size_t native_reference(const std::vector<std::vector<float>>& rounds, std::size_t heuristic,
                             std::size_t benchmark);

// Whether more rounds could change what settle_against_native decides: some finalist's median ratio to the
// finalist at `native` (the reference; positions in rounds) is below 1, yet the sign test does not show it
// faster. rounds[f][r] is finalist f's time in round r.
bool challenger_undecided(const std::vector<std::vector<float>>& rounds, std::size_t native);

// What a search's rounds measured, for its debug log (CUDNN_CACHE_LOG=debug): the rounds, the reference, and per
// other finalist its config, first-pass time, median in the rounds, median ratio to the reference, the rounds in
// which it was faster than the reference, and whether the sign test shows it faster. `finalists` holds the
// finalists' configs with their first-pass times, rounds[f][r] finalist f's time in round r; `heuristic` and
// `benchmark` are native's picks and `reference` the faster of them (native_reference), positions in rounds.
std::string describe_rounds(const std::vector<EngineCandidate>& finalists,
                            const std::vector<std::vector<float>>& rounds, std::size_t heuristic,
                            std::size_t benchmark, std::size_t reference);

// Sets the times of `configs` from the rounds in which the configs at `finalists` (positions in configs, one
// of them `native`, the reference; a lower position was timed earlier by the search) were timed together:
// rounds[f][r] is finalist f's time in round r. See the Note.
void settle_against_native(std::vector<EngineCandidate>& configs, std::size_t native,
                           const std::vector<std::size_t>& finalists, const std::vector<std::vector<float>>& rounds);

// Note [Settling in steady state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A search decides inside the step that missed: the process is busy tuning (worker threads
// compiling other candidates, the host's caches full of the search's graphs), and its rounds time a call, host
// part included (Note [Timing the whole call]), under that load. Where a key's kernels take a few microseconds the
// load is much of what the rounds see: on exhaustive RegNetY-400MF (fp32, H100, 2026-12-06) the search's rounds
// put the squeeze-excitation keys' configs at 18-23 us where the audit, run after the tuning step, timed the same
// configs at 12-15 us, and in three cold runs 1 to 3 keys' stored choices (each native's own pick in the search's
// rounds) were 2.6-6.5% slower than the other native pick in both of the process's audits.
// settle (cudnn_cache.settle; scripts/warm_start.py --exhaustive) decides each key again where the audit measures:
// its stored config and native's two picks are timed by audit_engine_choice, in paired rounds in a fresh order,
// and a native pick takes the stored config's place only where those rounds show it faster than the stored one
// (the sign test of Note [Never slower than native's pick], the stored config as the reference). A near-tie keeps
// the stored config: what a key costs alone is not all it costs inside a network. The first version let the
// faster native pick lead unless the rounds showed the stored config faster, and on that RegNetY it changed 19 of
// 102 keys, among them the grouped 3x3 backward-filter key from engine 23 to engine 20 (the two tie alone, 148-152
// us), which launches a kernel per group and memsets besides: the step's GPU time rose from 20.6 to 22.5 ms
// (the models benchmark's audit). This rule, on that network (H100), changed 3-4
// of 102 keys in 1.6-1.7 s; no key was slower in both audits in two settled runs (2 and 0 in two unsettled ones),
// and the step's GPU time stayed within the spread between runs (graph replays 19.79-19.81 ms settled,
// 19.78-19.85 ms not). Where a native pick takes the first place, the ranking's other configs keep
// the search's times, except that none stays before it or the stored config (one float step behind, as in the
// search); a deterministic call runs the ranking's first deterministic config, which that can change where the
// new first config is deterministic (settle compares with native's non-deterministic picks, as the audit does).
// Where none does, the key keeps its ranking as the search left it.

// The configs of a key's ranking (best first) settled by an audit of its first config (Note [Settling in steady
// state]): the audit's contenders are the finalists, with the audit's rounds, the stored config the reference; a
// native pick the ranking lacks joins it. The configs come back with settled times, to be ranked again
// (Ranking::of).
std::vector<EngineCandidate> settle_by_audit(std::vector<EngineCandidate> configs, const ChoiceAudit& audit);

// After settle_against_native: moves every deterministic config ranked before the finalist at `reference`
// (positions in rounds; a deterministic config, native's deterministic reference) one float step behind it,
// unless it is a finalist the rounds show faster than that one. See the Note.
void settle_deterministic(std::vector<EngineCandidate>& configs, std::size_t reference,
                          const std::vector<std::size_t>& finalists, const std::vector<std::vector<float>>& rounds);

}  // namespace cudnn_cache
