#pragma once

// Note [Search bounds]
// ~~~~~~~~~~~~~~~~~~~~
// How a graph-API search times each candidate and how many candidates each of its steps times (Note [Engine
// configs] in cudnn_cache/graph.h). These are constants of the search, not tuning options: each value is what a
// guarantee of the search or of its measurement rests on, and a user who wants another search has exhaustive
// (Note [Exhaustive search] in graph_search.cpp) or tunes offline (`python -m cudnn_cache tune FILE --jobs N`).
//   warmup 3             untimed runs of each candidate first, so that a plan's first-run costs (module loading,
//                        lazy allocations, clocks ramping up) are not timed; the audit warms up the same way.
//   repetitions 7        timed runs of each candidate, the median kept; and the paired rounds per pass of the
//                        confirming step, where 7 rounds make the sign test show a challenger faster only when it
//                        is faster in every round (Note [Never slower than native's pick] in paired_timing.h).
//   max_candidates 10    configs of heuristics mode A and the fallback list timed in step 1: native benchmark
//                        mode's cudnn.benchmark_limit, so that its pick is among them and the first pass's fastest
//                        of these stands for it (Note [Never slower than native's pick]).
//   mode_b_candidates 3  then heuristics mode B's first picks, and
//   knob_variants 4      the best config's knob neighbours (at most 2 steps away): a little more than native
//                        times, each one a plan build (milliseconds) and a timing, so that the default search
//                        takes seconds per key in a training process (Note [Exhaustive search]).
//   finalists 3          the fastest this many are timed again beside native's two picks in the paired rounds,
//                        which decide the ranking's first config; more finalists lengthen every round.
//   flush_l2 true        twice the L2 cache is written before each timed run: in a network a layer's operands
//                        come from other layers and rarely sit in L2 (Note [Engine configs]).
//   give_up_ratio 1.5    a candidate whose first 3 timed runs are all slower than this x the best median so far
//                        stops there: it cannot win, and slow candidates are where tuning time goes (Note [Giving
//                        up on a slow plan] in graph.cpp).
// Every config a search times must fit in the ranking it stores (kMaxEngineConfigs), with heuristics' first
// pick and native's deterministic pick (Note [Deterministic calls] in runtime.h): asserted below. Tests shorten
// searches with smaller bounds (tests/gpu/test_graph_gpu.cpp passes them to search_engine_configs; the Python
// tests set them through tests/torch/testing_ops.cpp and cudnn_cache_set_search_bounds); nothing else does.

#include "cudnn_cache/perf_cache.h"

namespace cudnn_cache::graph_internal {

// What Note [Search bounds] describes: its defaults are the search's constants.
struct SearchBounds {
  int warmup = 3;
  int repetitions = 7;
  int max_candidates = 10;
  int mode_b_candidates = 3;
  int knob_variants = 4;
  int finalists = 3;
  bool flush_l2 = true;
  float give_up_ratio = 1.5f;
};

static_assert(SearchBounds{}.max_candidates + SearchBounds{}.mode_b_candidates + SearchBounds{}.knob_variants + 2 <=
                  static_cast<int>(kMaxEngineConfigs),
              "a default search times more configs than a ranking keeps (Note [Search bounds])");

}  // namespace cudnn_cache::graph_internal

// The bounds every later search of the runtime uses (Runtime::tune and the tune miss policy); null restores the
// constants. For the Python tests only (tests/torch/testing_ops.cpp finds it with dlsym in the loaded ops
// library, which holds its own copy of the core).
extern "C" void cudnn_cache_set_search_bounds(const cudnn_cache::graph_internal::SearchBounds* bounds);
