#!/usr/bin/env bash
# The main job: installs what is missing, builds, then runs the warm start, which tunes every convolution of a
# model on the GPU and writes the cache file later runs load. Arguments go to scripts/warm_start.py; without
# any, it warms ResNet-50 (fp32, batch 32, 224x224) into ./cudnn_cache.bin. Needs a CUDA GPU: without one it
# says so and exits 2, writing nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
if [ "$#" -eq 0 ]; then
  set -- --model resnet50 --shape 3,224,224 --batch-size 32 --output cudnn_cache.bin
fi
exec python3 scripts/warm_start.py "$@"
