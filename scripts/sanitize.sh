#!/usr/bin/env bash
# Builds the Catch2 suite with clang's sanitizers and runs it.
#
#   scripts/sanitize.sh asan    AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer), whole suite,
#                               in build-asan/ (the fuzz targets of scripts/fuzz.sh share this build)
#   scripts/sanitize.sh tsan    ThreadSanitizer, the concurrency tests (tag [concurrency]), in build-tsan/
#   scripts/sanitize.sh asan --build-only   only builds (scripts/fuzz.sh uses it)
#
# The core links the CUDA toolkit's cuDNN and CUDA runtime, which are not instrumented; the few reports they
# cause are suppressed in scripts/sanitizers/*.supp (and ignorelist.txt at compile time), each with its reason.
# Any other report fails the run.
# Extra arguments after the mode go to the test binary (e.g. a Catch2 test name or tag).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true
build_only=0
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
fi
case "$mode" in
  asan)
    build_dir=${ASAN_BUILD_DIR:-build-asan}
    # fuzzer-no-link: coverage instrumentation for the fuzz targets built in the same tree (inert elsewhere).
    # UBSan's checks stay recoverable so that ubsan.supp applies; halt_on_error=1 below stops at the first
    # report that is not suppressed.
    flags="-fsanitize=address,undefined,fuzzer-no-link -fno-omit-frame-pointer"
    flags+=" -fsanitize-ignorelist=$PWD/scripts/sanitizers/ignorelist.txt"
    fuzzers=ON
    ;;
  tsan)
    build_dir=${TSAN_BUILD_DIR:-build-tsan}
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    fuzzers=OFF
    ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan [--build-only] [test arguments...]" >&2
    exit 2
    ;;
esac

supp=$PWD/scripts/sanitizers
# CMake's CUDA::nvrtc brings the driver's link stub (stubs/libcuda.so); like Debian's g++, link only what is used,
# so the binaries start on machines without a driver.
link_flags=-Wl,--as-needed
# Only the core, the tool and the Catch2 suite: no torch. cuDNN and the CUDA runtime come from the toolkit.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="${SANITIZE_CXX:-clang++}" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags $link_flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags $link_flags" \
  -DCUDNN_CACHE_BUILD_TORCH_OPS=OFF -DCUDNN_CACHE_BUILD_BENCHMARKS=OFF -DCUDNN_CACHE_BUILD_FUZZERS=$fuzzers >/dev/null
targets=(cudnn_cache_tests cudnn_cache_tool)
[ "$fuzzers" = ON ] && targets+=(cudnn_cache_fuzz_checkpoint cudnn_cache_fuzz_seeds)
cmake --build "$build_dir" --parallel "${SANITIZE_JOBS:-2}" --target "${targets[@]}"
[ "$build_only" -eq 1 ] && exit 0

symbolizer=$(command -v llvm-symbolizer || true)
# protect_shadow_gap=0: the CUDA runtime maps memory where ASan keeps its shadow gap when a GPU is present.
export ASAN_OPTIONS="detect_leaks=1:protect_shadow_gap=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:abort_on_error=0${symbolizer:+:external_symbolizer_path=$symbolizer}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp:print_suppressions=1"
if [ "$mode" = asan ]; then
  exec "$build_dir/tests/cudnn_cache_tests" "$@"
else
  exec "$build_dir/tests/cudnn_cache_tests" "${@:-[concurrency]}"
fi
