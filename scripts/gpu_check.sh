#!/usr/bin/env bash
# Builds cudnn_cache and runs everything that needs a GPU, on a machine that has PyTorch, CMake, Ninja and a
# compiler but cannot install packages (the GPU machine; what it needs, scripts/fetch_gpu_deps.sh unpacks into
# .deps/). Then runs each argument as a shell command (e.g. a benchmark). Logs go to $OUT (default ./gpu-logs),
# each step's tail to $OUT/SUMMARY.txt as it ends (the file sure to come back from the machine); the exit status
# is non-zero if any step failed. Variables: TAIL_LINES (of each log shown, default 15); BUILD_TARGETS (build only
# those, e.g. "cudnn_cache_ops cudnn_cache_eager cudnn_cache_tool" for pytest alone); GPU_TESTS=0 (no CTest or
# pytest); GPU_SHARDS (pytest processes at once, default 4, each every N-th test: --shard in conftest.py);
# PYTEST_ARGS (one pytest with these arguments instead; without a path, all of tests/python); PYTEST_K (a -k
# expression, which PYTEST_ARGS cannot hold where it has spaces); CUDNN_CACHE_CXX (the compiler).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-gpu-logs}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
step() {  # step NAME COMMAND...: runs COMMAND, logs to $out/NAME.log, prints the tail and the result
  local name=$1 started=$SECONDS rc report
  shift
  "$@" >"$out/$name.log" 2>&1
  rc=$?
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
# redis-server for tests/python/test_remote.py, and the wheels of hiredis, expecttest and tqdm.
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
step build build || exit 1
# The GPU tests (the CPU ones are CI's), in GPU_SHARDS processes at once: one after another they take ~10 minutes
# there, more than one call to the machine may run.
gpu_tests() {
  step ctest ctest --test-dir build --output-on-failure --parallel 8
  if [ -n "${PYTEST_ARGS:-}${PYTEST_K:-}" ]; then
    local select=()
    [ -n "${PYTEST_K:-}" ] && select=(-k "$PYTEST_K")
    # shellcheck disable=SC2086
    step pytest python3 -m pytest ${PYTEST_ARGS:-} "${select[@]}"
    return
  fi
  local shards=${GPU_SHARDS:-4} shard pid pids=()
  for ((shard = 0; shard < shards; shard++)); do
    step "pytest-$shard-of-$shards" python3 -m pytest tests/python -m "gpu and not gpu_memory" -q -rfs \
      -p no:cacheprovider --shard "$shard/$shards" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || status=1  # a step in the background sets its own shell's status, not this one's
  done
  # Tests that need much of the GPU's memory run after the shards, in one process: beside each other in shards
  # they ran out of memory (a 4 GiB tensor on an 80 GB H100, beside a ballast and another shard's 57 GiB).
  step pytest-gpu-memory python3 -m pytest tests/python -m gpu_memory -q -rfs -p no:cacheprovider
}
if [ "${GPU_TESTS:-1}" = 0 ]; then
  echo "== GPU_TESTS=0: CTest and pytest skipped"
else
  gpu_tests
fi
# Each extra command's log is extra-N-<its first characters>: numbered, since two commands that begin alike would
# otherwise share a log.
n=0
for extra in "$@"; do
  n=$((n + 1))
  step "extra-$n-$(echo "$extra" | tr -c 'a-zA-Z0-9' '_' | cut -c1-40)" bash -c "$extra"
done
exit "$status"
