#!/usr/bin/env bash
# Downloads Debian's cereal and Catch2 packages and unpacks them into .deps/root (ignored by git), and
# cudnn-frontend's headers into .deps/cudnn_frontend, for
# scripts/gpu_check.sh on the GPU machine, which cannot install packages itself.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/debs
(cd .deps/debs && apt-get download libcereal-dev catch2 rapidjson-dev)
for package in .deps/debs/*.deb; do dpkg -x "$package" .deps/root; done
rm -rf .deps/debs
./scripts/fetch_cudnn_frontend.sh
echo "unpacked into .deps/root: $(ls .deps/root/usr/include | tr '\n' ' ')"
