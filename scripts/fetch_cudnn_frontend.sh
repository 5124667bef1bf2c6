#!/usr/bin/env bash
# Unpacks cudnn-frontend's C++ headers from its PyPI wheel (taken with --no-deps) into .deps/cudnn_frontend,
# where CMake looks for them. Does nothing if they are there already.
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
target=.deps/cudnn_frontend
[ -f "$target/include/cudnn_frontend.h" ] && exit 0
download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  "nvidia-cudnn-frontend==$version" -d "$download"
python3 - "$download" "$target" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as archive:
    headers = [name for name in archive.namelist() if name.startswith("include/")]
    archive.extractall(sys.argv[2], members=headers)
print(f"fetch_cudnn_frontend: {len(headers)} headers from {wheel.name}")
PY
