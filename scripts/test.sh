#!/usr/bin/env bash
# The test command: installs what is missing, builds, then runs the Catch2 suite (through CTest) and pytest.
# Exits with pytest's status when the C++ suite passes (5 means pytest collected no tests).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
build_dir=${BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure --parallel "$(nproc)"
status=0
CUDNN_CACHE_BUILD_DIR="$build_dir" python3 -m pytest tests/python -q -rs || status=$?
exit "$status"
