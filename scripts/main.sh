#!/usr/bin/env bash
# The main job: installs what is missing, builds, then runs the warm start, which tunes every convolution of a
# model on the GPU and writes the cache file later runs load. Arguments go to scripts/warm_start.py; without
# any, it warms ResNet-50 (fp32, batch 32, 224x224) into ./cudnn_cache.bin. Needs a CUDA GPU: without one it
# says so at once and exits 2, installing, building and writing nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help)
    sed -n '2,5s/^# \{0,1\}//p' "$0"
    echo "usage: scripts/main.sh [warm_start.py arguments]; once set up: python3 scripts/warm_start.py --help"
    exit 0
    ;;
esac
# The GPU is looked for before minutes of installing and building; warm_start.py checks again with PyTorch.
if ! compgen -G "/dev/nvidia[0-9]*" >/dev/null && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "scripts/main.sh: no NVIDIA GPU on this machine (no /dev/nvidia*, no nvidia-smi); the warm start tunes on" \
       "one. Nothing was installed, built or written; ./scripts/test.sh sets up and tests without a GPU." >&2
  exit 2
fi
./scripts/install_deps.sh
./scripts/build.sh
if [ "$#" -eq 0 ]; then
  set -- --model resnet50 --shape 3,224,224 --batch-size 32 --output cudnn_cache.bin
fi
exec python3 scripts/warm_start.py "$@"
