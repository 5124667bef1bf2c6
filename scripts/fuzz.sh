#!/usr/bin/env bash
# Fuzzes the cache file loaders (deserialize and from_json) with libFuzzer for SECONDS seconds (default 60) under
# ASan and UBSan, in build-asan/ (built first by scripts/sanitize.sh if needed), from a fresh seed corpus of valid
# and damaged files of every format version; what it finds stays in build-asan/fuzz-corpus/ for the next run. A
# crash, leak, undefined behaviour, an exception other than cudnn_cache::Error, or an accepted file that does not
# save and load again fails the run, its input left in build-asan/fuzz-artifacts/ (replay:
# build-asan/tests/fuzz/cudnn_cache_fuzz_checkpoint FILE). Extra arguments go to libFuzzer (-runs=N -jobs=2).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
build_dir=${ASAN_BUILD_DIR:-build-asan}
ASAN_BUILD_DIR=$build_dir ./scripts/sanitize.sh asan --build-only

seeds=$build_dir/fuzz-seeds
corpus=$build_dir/fuzz-corpus
artifacts=$build_dir/fuzz-artifacts
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" "$artifacts"

symbolizer=$(command -v llvm-symbolizer || true)
export ASAN_OPTIONS="detect_leaks=1:protect_shadow_gap=0${symbolizer:+:external_symbolizer_path=$symbolizer}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$PWD/scripts/sanitizers/ubsan.supp"
export LSAN_OPTIONS="suppressions=$PWD/scripts/sanitizers/lsan.supp"
"$build_dir/tests/fuzz/cudnn_cache_fuzz_seeds" "$seeds"
# New inputs go into the first folder (the corpus); the seeds and tests/fuzz/regressions (inputs that once
# failed, kept so they are replayed on every run) are read only. -max_len: the seeds are at most a few KB, and
# longer inputs only slow the search down. It runs in the build folder, where -jobs=N puts its fuzz-N.log files.
root=$PWD
cd "$build_dir"
exec tests/fuzz/cudnn_cache_fuzz_checkpoint fuzz-corpus fuzz-seeds "$root/tests/fuzz/regressions" \
  -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix=fuzz-artifacts/ "$@"
