#!/usr/bin/env bash
# Builds cudnn_cache and runs everything that needs a GPU, on a machine that has PyTorch, CMake, Ninja and a
# compiler but cannot install packages (the GPU machine). cereal and Catch2 come from Debian packages unpacked
# into .deps/root by scripts/fetch_gpu_deps.sh on a machine that can download them. Logs go to $OUT (default
# ./gpu-logs); the exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-gpu-logs}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
# Each step's tail and result also go to $out/SUMMARY.txt as it ends: the device tool brings back at most 8 files
# (in name order, capitals first) and a call that runs past its limit prints nothing, so this file is what is
# sure to come back.
step() {  # step NAME COMMAND...: runs COMMAND, logs to $out/NAME.log, prints the tail and the result
  local name=$1
  shift
  local started=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local report
  report="$(tail -n "${TAIL_LINES:-15}" "$out/$name.log")
== $name: rc=$rc in $((SECONDS - started)) s"
  echo "$report"
  echo "$report" >>"$out/SUMMARY.txt"  # one write per step: steps in the background append whole reports
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}

# The distribution's g++ links libstdc++ dynamically. A toolchain that links it statically (seen on the GPU
# machine: $CXX=/opt/gcc/bin/g++) gives the ops library a private copy of iostreams whose locale is never set
# up, and the first error message it formats crashes the process.
compiler=${CUDNN_CACHE_CXX:-$(command -v /usr/bin/g++ || command -v g++)}
# What scripts/fetch_gpu_deps.sh unpacked: redis-server for tests/python/test_remote.py, and the wheels of
# hiredis (the remote store), expecttest (PyTorch's test material imports it) and tqdm.
export PATH="$PWD/.deps/root/usr/bin:$PATH"
# Debian's redis-server is a link to redis-check-rdb (the binary picks its role by its name): made again here in
# case the copy to this machine did not keep the link.
[ -e .deps/root/usr/bin/redis-check-rdb ] && ln -sf redis-check-rdb .deps/root/usr/bin/redis-server
export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for wheel in .deps/wheels/*.whl; do
  [ -e "$wheel" ] && python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" .deps/site
done
export PYTHONPATH="$PWD/.deps/site${PYTHONPATH:+:$PYTHONPATH}"
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cudnn_root=$(python3 -c 'import nvidia.cudnn; print(nvidia.cudnn.__path__[0])')
build() {
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())'
  cmake -S . -B build -G Ninja -DCMAKE_CXX_COMPILER="$compiler" -DCUDNN_ROOT="$cudnn_root" \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$PWD/.deps/root/usr" -DCUDNN_CACHE_BUILD_BENCHMARKS=OFF \
    -DPython3_EXECUTABLE="$(command -v python3)" &&
    cmake --build build --parallel "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
}
# BUILD_TARGETS builds only those targets (e.g. "cudnn_cache_ops cudnn_cache_eager cudnn_cache_tool" for pytest
# alone, about half the build), where a call's device time is short; CTest then needs the rest.
step build build || exit 1
# The GPU tests (the CPU ones are CI's; a Python process that imports torch takes ~5 s on the GPU machine, so
# they cost there far more than here), split into GPU_SHARDS processes that run at once (--shard, conftest.py):
# one after another they take ~10 minutes there, more than one call to the machine may run. PYTEST_ARGS runs one
# pytest with those arguments instead: PYTEST_ARGS="tests/python/test_x.py -k name" runs those tests; arguments
# that name no path run all of tests/python (pytest.ini's testpaths), e.g. PYTEST_ARGS="-v -rs". PYTEST_K adds
# a -k expression, which PYTEST_ARGS cannot hold where it has spaces: PYTEST_K="settle or audit".
gpu_tests() {
  step ctest ctest --test-dir build --output-on-failure --parallel 8
  if [ -n "${PYTEST_ARGS:-}${PYTEST_K:-}" ]; then
    local select=()
    [ -n "${PYTEST_K:-}" ] && select=(-k "$PYTEST_K")
    # shellcheck disable=SC2086
    step pytest python3 -m pytest ${PYTEST_ARGS:-} "${select[@]}"
    return
  fi
  local shards=${GPU_SHARDS:-4} shard pid
  local pids=()
  for ((shard = 0; shard < shards; shard++)); do
    step "pytest-$shard-of-$shards" python3 -m pytest tests/python -m "gpu and not gpu_memory" -q -rfs \
      -p no:cacheprovider --shard "$shard/$shards" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || status=1  # a step in the background sets its own shell's status, not this one's
  done
  # Tests that need much of the GPU's memory (a ballast, tensors of several GiB) run after the shards, in one
  # process: beside each other in shards they ran out of memory (a 4 GiB tensor on an 80 GB H100, twice on
  # 2026-12-06, beside a ballast, then beside another shard's 57 GiB of large tensors).
  step pytest-gpu-memory python3 -m pytest tests/python -m gpu_memory -q -rfs -p no:cacheprovider
}
# GPU_TESTS=0 skips them: the build, then the extra commands only (a measurement on code the suite already passed
# on, where device time is short).
if [ "${GPU_TESTS:-1}" = 0 ]; then
  echo "== GPU_TESTS=0: CTest and pytest skipped"
else
  gpu_tests
fi
# Further steps, each a shell command (e.g. a benchmark), logged as extra-N-<its first characters>: numbered, since
# two commands that begin alike would otherwise share a log and the second would overwrite the first's.
n=0
for extra in "$@"; do
  n=$((n + 1))
  step "extra-$n-$(echo "$extra" | tr -c 'a-zA-Z0-9' '_' | cut -c1-40)" bash -c "$extra"
done
exit "$status"
