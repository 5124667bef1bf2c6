#!/usr/bin/env bash
# The test command: installs what is missing, builds, then runs the Catch2 suite (through CTest) and pytest,
# then the reliability checks: the Catch2 suite under ASan+UBSan, its concurrency tests under TSan, and 60 s of
# fuzzing the cache file loaders (scripts/sanitize.sh, scripts/fuzz.sh; FUZZ_SECONDS changes the time,
# CUDNN_CACHE_SKIP_RELIABILITY=1 skips them). Exits with pytest's status when everything else passes (5 means
# pytest collected no tests), and 1 when a reliability check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
build_dir=${BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure --parallel "$(nproc)"
status=0
CUDNN_CACHE_BUILD_DIR="$build_dir" python3 -m pytest tests/python -q -rs || status=$?
if [ "${CUDNN_CACHE_SKIP_RELIABILITY:-0}" != 1 ]; then
  for check in "sanitize.sh asan" "sanitize.sh tsan" "fuzz.sh ${FUZZ_SECONDS:-60}"; do
    echo "== scripts/$check"
    # shellcheck disable=SC2086
    if ! ./scripts/$check; then
      echo "scripts/$check failed" >&2
      status=1
    fi
  done
fi
exit "$status"
