#!/usr/bin/env bash
# Configures and builds cudnn_cache into ./build (or $BUILD_DIR): the core, the tool, the tests, and the
# PyTorch ops library, against PyTorch's own LibTorch and cuDNN. Extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cudnn_root=$(python3 -c 'import nvidia.cudnn; print(nvidia.cudnn.__path__[0])')
cmake -S . -B "$build_dir" -G Ninja -DCUDNN_ROOT="$cudnn_root" -DCMAKE_PREFIX_PATH="$torch_prefix${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}" \
  -DPython3_EXECUTABLE="$(command -v python3)" "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
