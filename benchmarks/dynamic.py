"""Dynamic-shape benchmark (issue 17): training whose input shapes keep changing, each case in a fresh process.

Two workloads, each an epoch of 25 steps over 24 distinct input shapes in a random order and a smaller last
batch, every step forward and backward (loss = output.float().sum(), no optimizer step):

    detection   torchvision ResNet-18 trunk (no pooling or classifier), bf16 channels_last, batch 8, (H, W) 24
                distinct pairs of multiples of 32 in 480-800, the last batch 3
    audio       a wav2vec2-style 1-D feature extractor (seven Conv1d of 512 channels, GroupNorm, GELU), bf16,
                batch 8, 24 distinct lengths in 1-5 s of 16 kHz audio, the last batch 3

Modes, each in its own process (PyTorch's convolutions are intercepted by cudnn_cache in the cache modes). Every
mode first takes one step at the middle size (untimed in the epochs, reported as seed_s): the run before, whose
libraries, kernels and (in cache_nearest) tuned choice the epochs start from, the same in every mode.

    native_heuristic  torch.backends.cudnn.benchmark=False
    native_benchmark  benchmark=True: PyTorch times engines on every new shape
    native_benchmark_again
                      the same in another process: native's own spread. Benchmark mode times each engine once
                      and runs the fastest, so two processes may pick differently (by 0.5% on a shape, as
                      measured on an H200). Reported beside the next process's
                      targets, as what native itself reads against native_benchmark; not a target
    cache_tune        an empty cache under the 'tune' miss policy: every new shape is tuned on its first step
    cache_nearest     the middle size tuned first (its seed step, under 'tune'), as a file from an earlier run
                      would hold it, then the 'nearest' miss policy: every other shape runs that shape's choice where it runs (Note
                      [Nearest key]) and is pending; epoch 2 runs the same; then tune_pending() (timed, as
                      between epochs) and a third epoch runs every shape tuned; the file is saved
    cache_next        a fresh process loads that file and prepares its plans (timed), miss policy 'nearest'; after
                      its steady steps, each shape runs through the cache and in native benchmark mode in turn,
                      PAIRED_ROUNDS rounds (native's first step of a shape tunes it there)

Per mode: each epoch's wall time (synchronized at its end) and its slowest step; then, per shape, the GPU
time of a steady step (torch.profiler: kernels and copies, median of 5 steps each profiled on its own, each
kept) and its synchronized wall time (median of 5), in the last epoch's state. Targets (issue 17): the first
epoch under 'nearest' <= 1.05x native_heuristic's and <= 0.3x native_benchmark's; the next process (cache_next)
<= 1.00x native_benchmark's steady GPU time on every shape, side by side in its own process (the median of the
shape's per-round ratios; also reported: the shapes slower in every round, which noise alone seldom makes, and
the same rounds' wall-clock ratios; the ratios to the native_benchmark process are shown for reference: two
processes of native benchmark mode differ by as much), and its first epoch without a tuning stall: no
longer than native_heuristic's, which tunes nothing (a first epoch is always longer than the second: every
kernel's first use loads it).

The memory case (--memory, issue 17: memory flat over 1,000 shapes with the plan cache's bound in force): three
bf16 channels_last 3x3 convolutions, batch 2, forward and backward over 1,000 distinct (H, W) in 64-188, each
met once, in native_heuristic and in cache_nearest (one size tuned first, the plan cache bounded to
MEMORY_PLAN_LIMIT plans), each in its own process. Every 100 shapes: the process's resident memory, the CUDA
caching allocator's reserved and allocated memory, and the cache's counters (plans in memory, evictions, keys
lent, pending keys). Target: the cache's growth of resident memory over the last 500 shapes no larger than
native's, and its plans in memory within the bound at every sample.

Usage (after scripts/build.sh; needs a CUDA GPU, else it says so and exits 2):

    python3 -m benchmarks dynamic                  # both workloads, every mode: 10 minutes on an H200
    python3 -m benchmarks dynamic --workloads audio --modes native_heuristic cache_nearest cache_next
    python3 -m benchmarks dynamic --memory         # the memory case: about a minute

Writes bench-results/dynamic.json (--memory: dynamic_memory.json; every raw per-case result and the targets;
--json to move it, --update to write benchmarks/results/ too) and prints the tables (also written beside it as
.md). Exit codes: 0 every case ran; 1 some case failed; 2 bad
arguments or no GPU.
"""

import argparse
import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from benchmarks import case_command, output_paths, run_subprocess, write_result
from benchmarks.cases import gpu_time_per_step, in_turn, initialise_libraries, timed
from benchmarks.stats import median_interval

MODES = ("native_heuristic", "native_benchmark", "native_benchmark_again", "cache_nearest", "cache_next",
         "cache_tune")  # in run order
WORKLOADS = ("detection", "audio")
BATCH, LAST_BATCH, SHAPES = 8, 3, 24
PROFILED = 5  # steady steps per shape
PAIRED_ROUNDS, PAIRED_STEPS = 6, 3  # cache_next against native benchmark in its own process: rounds, steps each


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

        trunk = torchvision.models.resnet18(weights=None)
        model = nn.Sequential(*list(trunk.children())[:-2])  # up to layer4: the backbone a detector uses
        memory_format = torch.channels_last
        channels = 3
    else:
        layers, channels_in = [], 1
        for kernel, stride in [(10, 5)] + [(3, 2)] * 4 + [(2, 2)] * 2:
            layers += [nn.Conv1d(channels_in, 512, kernel, stride, bias=False), nn.GroupNorm(512, 512), nn.GELU()]
            channels_in = 512
        model = nn.Sequential(*layers)
        memory_format = torch.contiguous_format
        channels = 1
    model = model.to(device=device, dtype=torch.bfloat16, memory_format=memory_format).train()

    def make_input(batch: int, size: tuple) -> torch.Tensor:
        x = torch.rand(batch, channels, *size, device=device, dtype=torch.bfloat16)
        return x.contiguous(memory_format=memory_format).requires_grad_(True)

    return model, make_input


def run_case(workload: str, mode: str, cache_file: str) -> dict:
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

    def steady() -> List[dict]:
        rows = []
        for shape in dict.fromkeys(epoch):
            step = step_of(shape)
            wall = statistics.median(1e3 * timed(step, device) for _ in range(PROFILED))
            gpu, _ = gpu_time_per_step(step, device, PROFILED)
            rows.append({"batch": shape[0], "size": list(shape[1]), "wall_ms": wall,
                         "gpu_ms": statistics.median(gpu), "gpu_samples_ms": gpu})
        return rows

    result = {"workload": workload, "mode": mode, "shapes": len(set(epoch))}
    if cache is not None:
        cache.clear()
        cache.reset_stats()
        if mode == "cache_next":
            started = time.perf_counter()
            result["loaded_entries"] = cache.load(cache_file)
            result["prepared_plans"] = cache.prepare()
            result["load_prepare_s"] = time.perf_counter() - started
        cache.intercept(True)
        cache.set_miss_policy("tune" if mode in ("cache_tune", "cache_nearest") else "nearest")
    result["seed_s"] = timed(step_of(middle(epoch)), device)  # the run before (cache_nearest: its file's size)
    if cache is not None:
        cache.set_miss_policy("tune" if mode == "cache_tune" else "nearest")
        cache.reset_stats()
    result["epoch1"] = run_epoch()
    result["epoch2"] = run_epoch()
    if cache is not None:
        result["stats_epochs"] = cache.stats()
    if mode == "cache_nearest":
        result["steady_lent"] = steady()
        started = time.perf_counter()
        result["tuned_pending"] = cache.tune_pending()
        result["tune_pending_s"] = time.perf_counter() - started
        cache.save(cache_file)
        result["epoch3"] = run_epoch()
    result["steady"] = steady()
    if cache is not None:
        result["stats"] = cache.stats()
    if mode == "cache_next":
        result["steady_paired"] = paired_with_native_benchmark(cache, epoch, step_of, device)
    return result


def paired_with_native_benchmark(cache, epoch: List[Tuple[int, tuple]], step_of, device: torch.device) -> List[dict]:
    """Per shape, this process's steady GPU time and wall time through the cache and native benchmark mode's
    (intercept off, benchmark=True: its first step of the shape times its engines), in turn in PAIRED_ROUNDS
    rounds, each way's round the median of PAIRED_STEPS profiled steps and of PAIRED_STEPS synchronized steps. Two
    processes of native benchmark mode alone differ by 0.5% on a shape in GPU time (its one timing per engine
    picks differently), and by more on the wall clock: side by side in one process, the rounds compare the
    choices and the host paths, not the processes."""
    rows = []
    for shape in dict.fromkeys(epoch):
        step = step_of(shape)
        gpu_ms: Dict[str, List[float]] = {"cache": [], "native_benchmark": []}
        wall_ms: Dict[str, List[float]] = {"cache": [], "native_benchmark": []}
        for round_index in range(PAIRED_ROUNDS):
            for way in in_turn(list(gpu_ms), round_index):
                native = way == "native_benchmark"
                cache.intercept(not native)
                torch.backends.cudnn.benchmark = native
                step()
                wall_ms[way].append(statistics.median(1e3 * timed(step, device) for _ in range(PAIRED_STEPS)))
                gpu, _ = gpu_time_per_step(step, device, PAIRED_STEPS)
                gpu_ms[way].append(statistics.median(gpu))
        rows.append({"batch": shape[0], "size": list(shape[1]), "cache_gpu_ms": gpu_ms["cache"],
                     "native_benchmark_gpu_ms": gpu_ms["native_benchmark"],
                     "ratios": [a / b for a, b in zip(gpu_ms["cache"], gpu_ms["native_benchmark"])],
                     "cache_wall_ms": wall_ms["cache"], "native_benchmark_wall_ms": wall_ms["native_benchmark"],
                     "wall_ratios": [a / b for a, b in zip(wall_ms["cache"], wall_ms["native_benchmark"])]})
    cache.intercept(True)
    torch.backends.cudnn.benchmark = False
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The memory case
# ---------------------------------------------------------------------------------------------------------------

MEMORY_SHAPES, MEMORY_SAMPLE, MEMORY_PLAN_LIMIT, MEMORY_BATCH = 1000, 100, 1000, 2
MEMORY_MODES = ("native_heuristic", "cache_nearest")


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


def run_memory_case(mode: str) -> dict:
    from torch import nn

    device = torch.device("cuda")
    cache = None
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

    sizes = memory_sizes()
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
    for count, size in enumerate(sizes, 1):
        step(size)
        if count % MEMORY_SAMPLE == 0:
            torch.cuda.synchronize(device)
            sample = {"shapes": count, "seconds": time.perf_counter() - started, "resident_mib": resident_mib(),
                      "reserved_mib": torch.cuda.memory_reserved(device) / 2**20,
                      "allocated_mib": torch.cuda.memory_allocated(device) / 2**20}
            if cache is not None:
                s = cache.stats()
                sample.update({key: s.get(key) for key in ("plans_built", "plan_evictions", "lent", "misses",
                                                           "fallbacks", "tunes")})
                sample["plans_in_memory"] = s["plans"]
                sample["pending"] = len(cache.distributed.recorded_misses())
            samples.append(sample)
    result = {"workload": "memory", "mode": mode, "shapes": len(set(sizes)), "samples": samples}
    if cache is not None:
        result["plan_limit"] = cache.plan_cache_limit()
    return result


def memory_report(results: List[dict]) -> Tuple[List[str], List[dict]]:
    """The markdown rows of the memory case and its targets."""
    rows, targets, growth = [], [], {}
    for case in results:
        if "error" in case:
            last = (case["error"].strip().splitlines() or ["?"])[-1][:80]
            rows.append(f"| {case['mode']} | failed: {last} | | | | |")
            continue
        samples = case["samples"]
        half = next(s for s in samples if s["shapes"] >= MEMORY_SHAPES // 2)
        growth[case["mode"]] = samples[-1]["resident_mib"] - half["resident_mib"]
        resident = " / ".join(f"{s['resident_mib']:.0f}" for s in samples)
        reserved = " / ".join(f"{s['reserved_mib']:.0f}" for s in samples)
        plans = " / ".join(str(s.get("plans_in_memory", "-")) for s in samples)
        last = samples[-1]
        notes = (f"evictions {last['plan_evictions']}, lent {last['lent']}, pending {last['pending']}, "
                 f"limit {case['plan_limit']}" if "plan_limit" in case else "")
        rows.append(f"| {case['mode']} | {last['seconds']:.1f} | {resident} | {reserved} | {plans} | {notes} |")
        if "plan_limit" in case:
            most = max(s["plans_in_memory"] for s in samples)
            targets.append({"target": "plans in memory at any sample / the plan cache's bound",
                            "value": most / case["plan_limit"], "limit": 1.0,
                            "verdict": "met" if most <= case["plan_limit"] else "MISSED"})
    if len(growth) == 2:
        cache_growth, native_growth = growth["cache_nearest"], growth["native_heuristic"]
        targets.append({"target": f"resident MiB gained over shapes {MEMORY_SHAPES // 2}-{MEMORY_SHAPES}, "
                                  f"cache_nearest - native_heuristic ({cache_growth:.1f} - {native_growth:.1f})",
                        "value": cache_growth - native_growth, "limit": 0.0,
                        "verdict": "met" if cache_growth <= native_growth else "MISSED"})
    return rows, targets


# ---------------------------------------------------------------------------------------------------------------
# The driver and the report
# ---------------------------------------------------------------------------------------------------------------

def run_one(workload: str, mode: str, cache_file: pathlib.Path, timeout: float) -> dict:
    """One case in its own process (run_subprocess), named by its workload and mode however it ends."""
    command = case_command("dynamic", "--case", workload, mode, "--cache-file", cache_file)
    return {"workload": workload, "mode": mode, **run_subprocess(command, timeout)}


def ratios(case: dict, reference: dict, field: str, steady_key: str = "steady") -> Optional[List[float]]:
    """Per shape, case's steady `field` over the reference's."""
    if steady_key not in case or "steady" not in reference:
        return None
    return [a[field] / b[field] for a, b in zip(case[steady_key], reference["steady"])]


def shown_slower(case: dict, reference: dict) -> Optional[int]:
    """How many shapes the case ran slower than the reference in every profiled step (its fastest step's GPU
    time above the reference's slowest); None where the samples were not kept."""
    if "steady" not in case or "steady" not in reference:
        return None
    pairs = list(zip(case["steady"], reference["steady"]))
    if not all("gpu_samples_ms" in a and "gpu_samples_ms" in b for a, b in pairs):
        return None
    return sum(min(a["gpu_samples_ms"]) > max(b["gpu_samples_ms"]) for a, b in pairs)


def summarize(cases: Dict[str, dict]) -> Tuple[List[str], List[dict]]:
    """The markdown rows of one workload and its targets."""
    heuristic, benchmark = cases.get("native_heuristic", {}), cases.get("native_benchmark", {})
    rows, targets = [], []

    def spread(values: Optional[List[float]]) -> str:
        if not values:
            return "-"
        figure = median_interval(values) if len(values) >= 6 else {"median": statistics.median(values)}
        worst = max(values)
        if "lo" in figure:
            return f"{figure['median']:.3f} [{figure['lo']:.3f}, {figure['hi']:.3f}], worst {worst:.3f}"
        return f"{figure['median']:.3f}, worst {worst:.3f}"

    for mode in MODES:
        case = cases.get(mode)
        if case is None:
            continue
        if "error" in case:
            last = (case["error"].strip().splitlines() or ["?"])[-1][:80]
            rows.append(f"| {mode} | failed: {last} | | | | | |")
            continue
        epochs = " / ".join(f"{case[e]['total_s']:.2f}" for e in ("epoch1", "epoch2", "epoch3") if e in case)
        slowest = f"{case['epoch1']['slowest_ms']:.0f}"
        extra = []
        for key, label in (("seed_s", "seed step"), ("tune_pending_s", "tune_pending"),
                           ("load_prepare_s", "load+prepare")):
            if key in case:
                extra.append(f"{label} {case[key]:.2f} s")
        if "stats_epochs" in case:
            s = case["stats_epochs"]
            extra.append(f"epochs: misses {s['misses']}, tunes {s['tunes']}, lent {s.get('lent', '-')}, "
                         f"fallbacks {s['fallbacks']}")
        rows.append(f"| {mode} | {epochs} | {slowest} | {spread(ratios(case, benchmark, 'gpu_ms'))} | "
                    f"{spread(ratios(case, heuristic, 'gpu_ms'))} | {spread(ratios(case, benchmark, 'wall_ms'))} | "
                    f"{'; '.join(extra)} |")
        if mode == "cache_nearest" and "steady_lent" in case:
            rows.append(f"| cache_nearest, lent (epoch 2) | | | "
                        f"{spread(ratios(case, benchmark, 'gpu_ms', 'steady_lent'))} | "
                        f"{spread(ratios(case, heuristic, 'gpu_ms', 'steady_lent'))} | "
                        f"{spread(ratios(case, benchmark, 'wall_ms', 'steady_lent'))} | the borrowed choices |")
        if "steady_paired" in case:
            side = case["steady_paired"]
            medians = [statistics.median(row["ratios"]) for row in side]
            walls = [statistics.median(row["wall_ratios"]) for row in side if row.get("wall_ratios")]
            rows.append(f"| cache_next, side by side with native_benchmark in its process | | | {spread(medians)} | "
                        f"| {spread(walls)} | per shape, the median of {len(side[0]['ratios'])} rounds' ratios |")

    def target(name: str, value: Optional[float], limit: Optional[float]) -> None:  # limit None: for reference
        verdict = "not a target" if limit is None else "-" if value is None else "met" if value <= limit else "MISSED"
        targets.append({"target": name, "value": value, "limit": limit, "verdict": verdict})

    nearest, following = cases.get("cache_nearest", {}), cases.get("cache_next", {})
    first = lambda case: case["epoch1"]["total_s"] if "epoch1" in case else None  # noqa: E731
    if first(nearest) and first(heuristic):
        target("nearest epoch 1 / native_heuristic epoch 1", first(nearest) / first(heuristic), 1.05)
    if first(nearest) and first(benchmark):
        target("nearest epoch 1 / native_benchmark epoch 1", first(nearest) / first(benchmark), 0.3)
    paired = following.get("steady_paired")
    target("next process, worst shape: median of its per-round GPU time ratios to native_benchmark's, side by side "
           "in one process", max(statistics.median(row["ratios"]) for row in paired) if paired else None, 1.00)
    target("next process, shapes slower than native_benchmark in every round side by side",
           sum(min(row["ratios"]) > 1.0 for row in paired) if paired else None, 0)
    # The wall clock side by side: what a user sees of a steady step, host time included (not one of issue 17's
    # targets, which are GPU time; a loss here is the host path's, issue 15's).
    walls = [statistics.median(row["wall_ratios"]) for row in paired or [] if row.get("wall_ratios")]
    if walls:
        target("next process, median shape's wall time: median of its per-round ratios to native_benchmark's, side "
               "by side in one process", statistics.median(walls), None)
        target("next process, worst shape's wall time, side by side in one process", max(walls), None)
    worst = ratios(following, benchmark, "gpu_ms")
    if worst:
        target("for reference, next process, worst shape's GPU time / native_benchmark's (separate processes)",
               max(worst), None)
        target("for reference, next process, shapes slower than native_benchmark in every profiled step (separate "
               "processes)", shown_slower(following, benchmark), None)
    if first(following) and first(heuristic):
        target("next process, epoch 1 / native_heuristic epoch 1 (no tuning stall)",
               first(following) / first(heuristic), 1.00)
    # Native benchmark mode against itself: what the two next-process rows above read for native's own second
    # process (native_benchmark_again in the module's docstring).
    again = ratios(cases.get("native_benchmark_again", {}), benchmark, "gpu_ms")
    if again:
        target("for reference, native_benchmark in another process: worst shape / native_benchmark's", max(again),
               None)
        target("for reference, native_benchmark in another process: shapes slower in every profiled step",
               shown_slower(cases["native_benchmark_again"], benchmark), None)
    return rows, targets


def report(results: List[dict], environment: dict) -> Tuple[str, Dict[str, List[dict]]]:
    """The markdown tables, and the targets of each workload."""
    lines = [f"Dynamic-shape bench, {environment['date']}, {environment['device']}, torch {environment['torch']}, "
             f"cuDNN {environment['cudnn']}.", ""]
    all_targets = {}
    for workload in dict.fromkeys(r["workload"] for r in results):
        if workload == "memory":
            rows, targets = memory_report([r for r in results if r["workload"] == "memory"])
            all_targets[workload] = targets
            lines += [f"### memory: {MEMORY_SHAPES} distinct shapes, sampled every {MEMORY_SAMPLE}", "",
                      "| mode | seconds | resident MiB | CUDA reserved MiB | plans in memory | notes |",
                      "|---|---|---|---|---|---|"] + rows + ["", "| target | value | limit | verdict |",
                                                           "|---|---|---|---|"]
            lines += [f"| {t['target']} | {t['value']:.3f} | {t['limit']} | {t['verdict']} |" for t in targets]
            lines.append("")
            continue
        rows, targets = summarize({r["mode"]: r for r in results if r["workload"] == workload})
        all_targets[workload] = targets
        lines += [f"### {workload}", "",
                  "| mode | epoch 1 / 2 / 3 (s) | slowest step of epoch 1 (ms) | steady GPU time / native_benchmark, "
                  "per shape: median [95%], worst | steady GPU time / native_heuristic | steady wall / "
                  "native_benchmark | notes |", "|---|---|---|---|---|---|---|"] + rows + ["",
                  "| target | value | limit | verdict |", "|---|---|---|---|"]
        lines += [f"| {t['target']} | {'-' if t['value'] is None else format(t['value'], '.3f')} | "
                  f"{'-' if t['limit'] is None else t['limit']} | {t['verdict']} |" for t in targets]
        lines.append("")
    return "\n".join(lines), all_targets


def write(results: List[dict], environment: dict, paths: List[pathlib.Path]) -> str:
    """Writes the JSON and the tables (after every case, so that a run cut short keeps what it measured)."""
    table, targets = report(results, environment)
    write_result({"environment": environment, "targets": targets, "results": results}, paths, table)
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--json", help="the result file (default bench-results/dynamic.json, with --memory "
                                       "dynamic_memory.json)")
    parser.add_argument("--update", action="store_true", help="also write the committed one in benchmarks/results/")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--memory", action="store_true",
                        help="run the memory case (1,000 shapes) instead of the workloads")
    parser.add_argument("--case", nargs=2, metavar=("WORKLOAD", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--cache-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        workload, mode = args.case
        print(json.dumps(run_memory_case(mode) if workload == "memory" else run_case(workload, mode, args.cache_file)))
        return 0
    if "cache_next" in args.modes and "cache_nearest" not in args.modes:
        parser.error("cache_next loads the file cache_nearest saves: run both")
    if not torch.cuda.is_available():
        print("dynamic: no CUDA GPU is visible", file=sys.stderr)
        return 2
    environment = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(),
                   "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    results = []
    out = output_paths("dynamic_memory.json" if args.memory else "dynamic.json", args.json, args.update)
    if args.memory:
        for mode in MEMORY_MODES:
            results.append(run_one("memory", mode, pathlib.Path(os.devnull), args.timeout))
            table = write(results, environment, out)
        print(table)
        return 1 if any("error" in r for r in results) else 0
    with tempfile.TemporaryDirectory(prefix="bench_dynamic_") as folder:
        for workload in args.workloads:
            cache_file = pathlib.Path(folder) / f"{workload}.cache"
            for mode in MODES:
                if mode in args.modes:
                    results.append(run_one(workload, mode, cache_file, args.timeout))
                    print(f"{workload} {mode}: " + ("failed" if "error" in results[-1] else
                                                    f"epoch 1 {results[-1]['epoch1']['total_s']:.2f} s"),
                          file=sys.stderr, flush=True)
                    table = write(results, environment, out)
    print(table)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
