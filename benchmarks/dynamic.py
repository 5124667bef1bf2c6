"""Training whose input shapes keep changing (issue 17), each case in a fresh process.

Two workloads, each an epoch of 25 steps, forward and backward, over 24 distinct input shapes in a random order
and a smaller last batch: detection, torchvision's ResNet-18 trunk, bf16 channels_last, batch 8 at (H, W) pairs of
multiples of 32 in 480-800; audio, a wav2vec2-style feature extractor (seven Conv1d of 512 channels, GroupNorm,
GELU), bf16, batch 8 at lengths in 1-5 s of 16 kHz audio; both last batches 3. Every mode first takes one untimed
step at the middle size (seed_s); the cache modes intercept PyTorch's convolutions:
    native_heuristic        torch.backends.cudnn.benchmark=False
    native_benchmark        benchmark=True: PyTorch times engines on every new shape
    native_benchmark_again  the same in another process: native's own spread, beside the next process's figures
    cache_nearest           the middle size tuned first (as an earlier run's file would hold it), then the 'nearest'
                            miss policy (Note [Nearest key]) for two epochs; tune_pending() (timed), a third epoch,
                            and the file is saved
    cache_next              a fresh process loads that file and prepares its plans (timed), policy 'nearest'; after
                            its epochs each shape runs through the cache and in native benchmark mode in turn,
                            PAIRED_ROUNDS rounds, each way's steady GPU time (torch.profiler) and wall time
    cache_tune              an empty cache under the 'tune' policy: every new shape is tuned on its first step
Per mode, each epoch's wall time and its slowest step. Targets: the first epoch under 'nearest' <= 1.05x
native_heuristic's and <= 0.3x native_benchmark's; in the next process, every shape's GPU time <= native_benchmark's
side by side (the median of its per-round ratios), no shape slower in every round, and the first epoch no longer
than native_heuristic's (no tuning stall).

--memory: three bf16 channels_last 3x3 convolutions, batch 2, forward and backward over 1,000 distinct (H, W) in
64-188, in native_heuristic and in cache_nearest (one size tuned first, the plan cache bounded to 1,000 plans);
every 100 shapes, resident memory and the allocator's and the cache's counters. Targets: plans in memory within
the bound at every sample; resident memory over the last 500 shapes growing no more than native's.

    python3 -m benchmarks dynamic --update       # both workloads, every mode: 10 minutes on an H200
    python3 -m benchmarks dynamic --workloads audio --modes native_heuristic,cache_nearest,cache_next
    python3 -m benchmarks dynamic --memory       # about a minute

Writes bench-results/dynamic.json (--memory: dynamic_memory.json) and its tables after every case. Exit codes: 0
every case ran; 1 some case failed; 2 bad arguments or no GPU.
"""

import argparse
import pathlib
import random
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch

from benchmarks import add_arguments, case_command, combine, no_gpu, output_paths, parse, run_case, run_plan, write_result
from benchmarks.measure import gpu_time_per_step, in_turn, initialise_libraries, timed
from benchmarks.performance_doc import render_dynamic, render_memory

MODES = ("native_heuristic", "native_benchmark", "native_benchmark_again", "cache_nearest", "cache_next",
         "cache_tune")  # in run order
WORKLOADS = ("detection", "audio")
BATCH, LAST_BATCH, SHAPES = 8, 3, 24
PAIRED_ROUNDS, PAIRED_STEPS = 6, 3  # cache_next against native benchmark in its own process: rounds, steps each
MEMORY_SHAPES, MEMORY_SAMPLE, MEMORY_PLAN_LIMIT, MEMORY_BATCH = 1000, 100, 1000, 2
MEMORY_MODES = ("native_heuristic", "cache_nearest")


def shapes(workload: str) -> List[Tuple[int, tuple]]:
    """An epoch: (batch, spatial size) per step, 24 distinct sizes in a random order (the same in every
    process), then the smaller last batch at the first size."""
    rng = random.Random(17)
    if workload == "detection":
        sides = range(480, 801, 32)
        sizes = rng.sample([(h, w) for h in sides for w in sides], SHAPES)
    else:
        sizes = [(length,) for length in rng.sample(range(16000, 80001, 320), SHAPES)]
    return [(BATCH, size) for size in sizes] + [(LAST_BATCH, sizes[0])]


def middle(epoch: List[Tuple[int, tuple]]) -> Tuple[int, tuple]:
    """The step whose input is the median size: what cache_nearest tunes first."""
    full = sorted(epoch[:-1], key=lambda step: torch.Size(step[1]).numel())
    return full[len(full) // 2]


def build(workload: str, device: torch.device) -> Tuple[torch.nn.Module, Callable[[int, tuple], torch.Tensor]]:
    """The model (bf16, training mode) and a maker of its input for (batch, spatial size)."""
    from torch import nn

    torch.manual_seed(0)
    if workload == "detection":
        import torchvision

        model = nn.Sequential(*list(torchvision.models.resnet18(weights=None).children())[:-2])  # the backbone
        memory_format, channels = torch.channels_last, 3
    else:
        layers, channels_in = [], 1
        for kernel, stride in [(10, 5)] + [(3, 2)] * 4 + [(2, 2)] * 2:
            layers += [nn.Conv1d(channels_in, 512, kernel, stride, bias=False), nn.GroupNorm(512, 512), nn.GELU()]
            channels_in = 512
        model, memory_format, channels = nn.Sequential(*layers), torch.contiguous_format, 1
    model = model.to(device=device, dtype=torch.bfloat16, memory_format=memory_format).train()

    def make_input(batch: int, size: tuple) -> torch.Tensor:
        x = torch.rand(batch, channels, *size, device=device, dtype=torch.bfloat16)
        return x.contiguous(memory_format=memory_format).requires_grad_(True)

    return model, make_input


def workload_case(workload: str, mode: str, cache_file: str, result: dict) -> None:
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = mode.startswith("native_benchmark")
    cache = None
    if mode.startswith("cache_"):
        import cudnn_cache as cache
    initialise_libraries(device, cache)
    model, make_input = build(workload, device)
    epoch = shapes(workload)
    inputs = {step: make_input(*step) for step in dict.fromkeys(epoch)}

    def step_of(shape: Tuple[int, tuple]) -> Callable[[], None]:
        def step() -> None:
            model.zero_grad(set_to_none=True)
            model(inputs[shape]).float().sum().backward()
        return step

    def run_epoch() -> dict:
        steps = [1e3 * timed(step_of(shape), device) for shape in epoch]
        return {"total_s": sum(steps) / 1e3, "steps_ms": steps, "slowest_ms": max(steps)}

    result["shapes"] = len(set(epoch))
    if cache is not None:
        cache.clear()
        cache.reset_stats()
        if mode == "cache_next":
            started = time.perf_counter()
            result["loaded_entries"], result["prepared_plans"] = cache.load(cache_file), cache.prepare()
            result["load_prepare_s"] = time.perf_counter() - started
        cache.intercept(True)
        cache.set_miss_policy("tune" if mode in ("cache_tune", "cache_nearest") else "nearest")
    result["seed_s"] = timed(step_of(middle(epoch)), device)  # the run before (cache_nearest: its file's size)
    if cache is not None:
        cache.set_miss_policy("tune" if mode == "cache_tune" else "nearest")
        cache.reset_stats()
    result["epoch1"], result["epoch2"] = run_epoch(), run_epoch()
    if cache is not None:
        result["stats_epochs"] = cache.stats()
    if mode == "cache_nearest":
        started = time.perf_counter()
        result["tuned_pending"] = cache.tune_pending()
        result["tune_pending_s"] = time.perf_counter() - started
        cache.save(cache_file)
        result["epoch3"] = run_epoch()
    if cache is not None:
        result["stats"] = cache.stats()
    if mode == "cache_next":
        result["steady_paired"] = [paired_with_native_benchmark(cache, shape, step_of(shape), device)
                                   for shape in dict.fromkeys(epoch)]


def paired_with_native_benchmark(cache, shape: Tuple[int, tuple], step: Callable[[], None],
                                 device: torch.device) -> dict:
    """A shape's steady GPU and wall time through the cache and in native benchmark mode (intercept off: its
    first step of the shape times its engines), in turn in PAIRED_ROUNDS rounds, each way's round the median of
    PAIRED_STEPS profiled and PAIRED_STEPS synchronized steps: two processes of native benchmark mode differ by
    0.5% on a shape in GPU time, so side by side in one process the rounds compare choices, not processes."""
    gpu_ms: Dict[str, List[float]] = {"cache": [], "native_benchmark": []}
    wall_ms: Dict[str, List[float]] = {"cache": [], "native_benchmark": []}
    for round_index in range(PAIRED_ROUNDS):
        for way in in_turn(list(gpu_ms), round_index):
            cache.intercept(way == "cache")
            torch.backends.cudnn.benchmark = way == "native_benchmark"
            step()
            wall_ms[way].append(statistics.median(1e3 * timed(step, device) for _ in range(PAIRED_STEPS)))
            gpu_ms[way].append(statistics.median(gpu_time_per_step(step, device, PAIRED_STEPS)))
    cache.intercept(True)
    torch.backends.cudnn.benchmark = False
    return {"batch": shape[0], "size": list(shape[1]), "cache_gpu_ms": gpu_ms["cache"],
            "native_benchmark_gpu_ms": gpu_ms["native_benchmark"],
            "ratios": [a / b for a, b in zip(gpu_ms["cache"], gpu_ms["native_benchmark"])],
            "cache_wall_ms": wall_ms["cache"], "native_benchmark_wall_ms": wall_ms["native_benchmark"],
            "wall_ratios": [a / b for a, b in zip(wall_ms["cache"], wall_ms["native_benchmark"])]}


def memory_sizes() -> List[Tuple[int, int]]:
    """1,000 distinct (H, W), both multiples of 4 in 64-188, in a fixed random order."""
    sides = range(64, 192, 4)
    return random.Random(1000).sample([(h, w) for h in sides for w in sides], MEMORY_SHAPES)


def resident_mib() -> float:
    """The process's resident memory (VmRSS), MiB."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def memory_case(mode: str, result: dict) -> None:
    from torch import nn

    device, cache = torch.device("cuda"), None
    if mode == "cache_nearest":
        import cudnn_cache as cache
        import cudnn_cache.distributed  # noqa: F401  (recorded_misses: the pending keys)
    initialise_libraries(device, cache)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
                          nn.Conv2d(64, 64, 3, 1, 1))
    model = model.to(device=device, dtype=torch.bfloat16, memory_format=torch.channels_last).train()

    def step(size: Tuple[int, int]) -> None:
        x = torch.rand(MEMORY_BATCH, 3, *size, device=device, dtype=torch.bfloat16)
        model.zero_grad(set_to_none=True)
        model(x.contiguous(memory_format=torch.channels_last)).float().sum().backward()

    if cache is not None:
        cache.clear()
        cache.set_plan_cache_limit(MEMORY_PLAN_LIMIT)
        cache.intercept(True)
        cache.set_miss_policy("tune")
    step((128, 128))  # cache_nearest: the one tuned size, as an earlier run's file would hold it
    if cache is not None:
        cache.set_miss_policy("nearest")
        cache.reset_stats()
    samples, started = [], time.perf_counter()
    for count, size in enumerate(memory_sizes(), 1):
        step(size)
        if count % MEMORY_SAMPLE == 0:
            torch.cuda.synchronize(device)
            sample = {"shapes": count, "seconds": time.perf_counter() - started, "resident_mib": resident_mib(),
                      "reserved_mib": torch.cuda.memory_reserved(device) / 2**20,
                      "allocated_mib": torch.cuda.memory_allocated(device) / 2**20}
            if cache is not None:
                stats = cache.stats()
                sample.update({key: stats.get(key) for key in ("plans_built", "plan_evictions", "lent", "misses",
                                                               "fallbacks", "tunes")},
                              plans_in_memory=stats["plans"], pending=len(cache.distributed.recorded_misses()))
            samples.append(sample)
    result.update(shapes=MEMORY_SHAPES, samples=samples)
    if cache is not None:
        result["plan_limit"] = cache.plan_cache_limit()


def verdict(value, limit) -> str:
    return "-" if value is None else "met" if value <= limit else "MISSED"


def memory_targets(cases: List[dict]) -> List[dict]:
    targets, growth = [], {}
    for case in (c for c in cases if "error" not in c):
        samples = case["samples"]
        half = next(s for s in samples if s["shapes"] >= MEMORY_SHAPES // 2)
        growth[case["mode"]] = samples[-1]["resident_mib"] - half["resident_mib"]
        if "plan_limit" in case:
            most = max(s["plans_in_memory"] for s in samples)
            targets.append({"target": "plans in memory at any sample / the plan cache's bound",
                            "value": most / case["plan_limit"], "limit": 1.0, "verdict": verdict(most, case["plan_limit"])})
    if len(growth) == 2:
        ours, native = growth["cache_nearest"], growth["native_heuristic"]
        targets.append({"target": f"resident MiB gained over shapes {MEMORY_SHAPES // 2}-{MEMORY_SHAPES}, "
                                  f"cache_nearest - native_heuristic ({ours:.1f} - {native:.1f})",
                        "value": ours - native, "limit": 0.0, "verdict": verdict(ours, native)})
    return targets


def workload_targets(cases: Dict[str, dict]) -> List[dict]:
    """The targets of one workload, from its cases by mode (the module's docstring)."""
    targets = []

    def target(name: str, value, limit) -> None:
        targets.append({"target": name, "value": value, "limit": limit, "verdict": verdict(value, limit)})

    def first(mode: str):
        return cases.get(mode, {}).get("epoch1", {}).get("total_s")

    if first("cache_nearest") and first("native_heuristic"):
        target("nearest epoch 1 / native_heuristic epoch 1", first("cache_nearest") / first("native_heuristic"), 1.05)
    if first("cache_nearest") and first("native_benchmark"):
        target("nearest epoch 1 / native_benchmark epoch 1", first("cache_nearest") / first("native_benchmark"), 0.3)
    paired = cases.get("cache_next", {}).get("steady_paired")
    target("next process, worst shape: median of its per-round GPU time ratios to native_benchmark's, side by side "
           "in one process", max(statistics.median(row["ratios"]) for row in paired) if paired else None, 1.00)
    target("next process, shapes slower than native_benchmark in every round side by side",
           sum(min(row["ratios"]) > 1.0 for row in paired) if paired else None, 0)
    if first("cache_next") and first("native_heuristic"):
        target("next process, epoch 1 / native_heuristic epoch 1 (no tuning stall)",
               first("cache_next") / first("native_heuristic"), 1.00)
    return targets


def write(results: List[dict], environment: dict, paths: List[pathlib.Path]) -> str:
    """The JSON, its targets computed again, and the tables beside it (after every case: a run cut short keeps
    what it measured); returns the tables."""
    targets = {}
    for workload in dict.fromkeys(r["workload"] for r in results):
        cases = [r for r in results if r["workload"] == workload]
        targets[workload] = (memory_targets(cases) if workload == "memory"
                             else workload_targets({c["mode"]: c for c in cases if "error" not in c}))
    data = {"environment": environment, "targets": targets, "results": results}
    text = "\n".join(render_memory(data) if "memory" in targets else render_dynamic(data))
    write_result(data, paths, text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, "dynamic.json", workloads=WORKLOADS, modes=MODES, timeout=300.0)
    parser.add_argument("--memory", action="store_true", help="the memory case (1,000 shapes) instead of the workloads")
    args = parse(parser, argv, WORKLOADS, MODES)
    modes = [mode for mode in MODES if mode in (args.modes or MODES)]
    if "cache_next" in modes and "cache_nearest" not in modes:
        parser.error("cache_next loads the file cache_nearest saves: run both")
    paths = output_paths("dynamic_memory.json" if args.memory else "dynamic.json", args.output, args.update)
    if args.combine:
        data = combine(args.combine, ("results",))
        print(write(data["results"], data["environment"], paths))
        return 0
    if no_gpu(args.device, "dynamic"):
        return 2
    if args.case:
        workload, mode = args.case.split(":")
        return run_case(lambda result: memory_case(mode, result) if workload == "memory"
                        else workload_case(workload, mode, args.cache_file, result),
                        {"workload": workload, "mode": mode})
    environment = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(),
                   "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    plan = ([("memory", mode, 1) for mode in MEMORY_MODES] if args.memory else
            [(workload, mode, 1) for workload in args.workloads or WORKLOADS for mode in modes])
    results = run_plan(plan, {"cache_next": "cache_nearest"},
                       lambda workload, mode, cache_file: (case_command("dynamic", "--case", f"{workload}:{mode}",
                                                                        "--cache-file", cache_file), None),
                       args, lambda r: f"epoch 1 {r['epoch1']['total_s']:.2f} s" if "epoch1" in r else "done",
                       lambda results: write(results, environment, paths))
    print(write(results, environment, paths))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
