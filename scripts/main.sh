#!/usr/bin/env bash
# The main job: installs what is missing, builds, then writes a cache file of synthetic entries, checks it and
# lists it. ($CACHE_FILE, default ./cudnn_cache.bin; $ENTRIES, default 1000.)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
tool=${BUILD_DIR:-build}/cudnn_cache_tool
cache_file=${CACHE_FILE:-cudnn_cache.bin}
"$tool" synth "$cache_file" --entries "${ENTRIES:-1000}"
"$tool" validate "$cache_file"
"$tool" inspect "$cache_file" | tail -n 5
