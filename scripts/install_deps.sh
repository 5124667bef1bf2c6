#!/usr/bin/env bash
# Installs what building and testing cudnn_cache needs on a fresh Debian machine with the CUDA toolkit, only what
# is missing: Debian's cereal, Catch2, Google Benchmark, CMake, Ninja, clang with its sanitizer and libFuzzer
# runtimes and llvm's symbolizer (scripts/sanitize.sh, scripts/fuzz.sh) and redis-server (tests/python/test_remote.py
# starts its own); from PyPI, PyTorch 2.11.0 (which brings the cuDNN the project builds against), torchvision,
# the test tools, expecttest (PyTorch's test material imports it) and hiredis (the remote store's client);
# cudnn-frontend's headers into .deps/; last, this checkout's package, editable, with the `cudnn_cache` command
# (pip install -e builds nothing: the package loads the ops library scripts/build.sh builds into ./build).
set -euo pipefail

debian_packages=(libcereal-dev catch2 libbenchmark-dev cmake ninja-build g++ clang libclang-rt-14-dev llvm
  redis-server)
missing=()
for package in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
  "torch==2.11.0" "torchvision==0.26.0" "pytest>=7" "numpy" "tqdm" "wheel" "expecttest" "hiredis>=2.2.1"
"$(dirname "$0")/fetch_cudnn_frontend.sh"
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-build-isolation --no-deps \
  --editable "$(dirname "$0")/.."
if command -v pyenv >/dev/null; then pyenv rehash; fi  # pyenv's shims are how its Python's commands reach PATH
