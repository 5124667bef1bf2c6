#!/usr/bin/env bash
# Downloads Debian's cereal and Catch2 packages, and redis-server with the libraries it needs, and unpacks them
# into .deps/root (ignored by git); cudnn-frontend's headers into .deps/cudnn_frontend; and the wheels of hiredis,
# expecttest and tqdm (for the GPU machine's Python, PYTHON_VERSION, default 3.12) into .deps/wheels, for
# scripts/gpu_check.sh on the GPU machine, which cannot install packages itself.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/debs
(cd .deps/debs && apt-get download libcereal-dev catch2 rapidjson-dev redis-server redis-tools libjemalloc2 liblzf1)
for package in .deps/debs/*.deb; do dpkg -x "$package" .deps/root; done
rm -rf .deps/debs
./scripts/fetch_cudnn_frontend.sh
python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --platform manylinux2014_x86_64 \
  --python-version "${PYTHON_VERSION:-3.12}" -d .deps/wheels "hiredis>=2.2.1" expecttest tqdm
echo "unpacked into .deps/root: $(ls .deps/root/usr/include | tr '\n' ' ')"
