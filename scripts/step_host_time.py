#!/usr/bin/env python3
"""Host time of a whole training step: natively and through the cache on each backend, interleaved in one
process, with the GPU idle at the step's start and with a long kernel queued first.

A host-bound step (its wall time above its GPU time) costs what its host work costs, so a cache that adds host
time per call loses on the wall clock there even where its kernels are faster. This times that host work
alone: from the step's start to its return, without synchronizing inside (zero_grad, forward,
loss = output.float().sum(), backward, as in scripts/bench.py). 'busy' queues a kernel of --busy-ms first, so
that every launch of the step waits in the queue behind it and nothing the host does can wait for the GPU;
'idle' starts from an empty queue. The ways, in an order drawn anew each round (bench_cases.in_turn), each warmed up
by two steps first:

    native   PyTorch's own convolutions, cudnn.benchmark=False
    graph    the same model under cudnn_cache.intercept(), graph-API backend (the default)
    legacy   the same under intercept, legacy backend (cudnnConvolution*)

--deterministic runs every way under torch.use_deterministic_algorithms(True): native's deterministic engines
against the cache's deterministic configs (Note [Deterministic calls] in extension/include/cudnn_cache/runtime.h).

--plans says which execution plans the graph way runs (a GPU only): 'search' (default) those kept after each
search, as in the process that tuned (made again from the search's on this thread's handle: Note [The plan a
search keeps] in extension/src/plan_cache.h); 'caller' the same configs' plans dropped after tuning and made
again by the warm-up steps, on this thread's cuDNN handle; 'pool' dropped and made again by
cudnn_cache.prepare() on its pool's handles, as in a warm process. PyTorch builds every plan on the handle of
the thread that runs it; a step whose host time depends on which handle built its plans shows it here, one
process per choice.

Both cache ways run configs tuned for the model before the rounds (miss policy 'tune', then 'error'). Per way
and state it prints the host time per step, median [95%], and the median of its per-round ratios to native's
[95%]; on a GPU, also each way's GPU time per step in the same rounds (torch.profiler, GPU_STEPS profiled steps
per round: kernels and copies), the same way: a faster host path must not run slower kernels; --profile adds
each way's self CPU time per step by operator and CUDA runtime call (torch.profiler).

    python3 scripts/step_host_time.py --workload resnet18_fp16_cl --rounds 30
    python3 scripts/step_host_time.py --workload resnet50_fp32 --profile --json /tmp/step_host_time.json
    python3 scripts/step_host_time.py --workload resnet18_fp16_cl --deterministic
    python3 scripts/step_host_time.py --workload mobilenet_v2_bf16_cl --plans pool

Needs a CUDA GPU for figures that mean anything; --device cpu runs the same code (idle only) as a smoke test.
"""

import argparse
import json
import pathlib
import statistics
import sys
import time
from collections import defaultdict
from typing import Callable, Dict, List

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "torch_ops"))  # `import cudnn_cache` from the source checkout (ops in build/)

from bench_cases import (WORKLOADS, device_of, drop_plans, gpu_time_per_step, in_turn,  # noqa: E402
                         initialise_libraries, model_and_input, profile_each_step)
from bench_stats import median_interval  # noqa: E402

WAYS = ("native", "graph", "legacy")
PLANS = ("search", "caller", "pool")  # --plans
PROFILED = 3  # steps per way and state with --profile
GPU_STEPS = 3  # profiled steps per way and round, on a GPU
SHOWN = 25  # rows of the --profile table


def use(cache, way: str) -> None:
    """Routes the model's convolutions the way `way` says."""
    torch.backends.cudnn.benchmark = False
    cache.intercept(way != "native")
    if way != "native":
        cache.set_backend(way)


def queue_kernel(device: torch.device, milliseconds: float) -> None:
    """A kernel that keeps the GPU busy for about `milliseconds` (torch.cuda._sleep counts clock cycles)."""
    clock_khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 1_980_000)
    torch.cuda._sleep(int(milliseconds * clock_khz))


def host_ms(step: Callable[[], None], device: torch.device, busy_ms: float) -> float:
    """The host time of one step, from an empty queue, or behind a kernel of busy_ms when it is above 0."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        if busy_ms > 0:
            queue_kernel(device, busy_ms)
    started = time.perf_counter()
    step()
    elapsed = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 1e3 * elapsed


def self_cpu_us(step: Callable[[], None], device: torch.device, busy_ms: float) -> Dict[str, Dict[str, float]]:
    """Per operator and CUDA runtime call: calls and self CPU microseconds per step (mean of PROFILED steps, each
    profiled on its own by bench_cases.profile_each_step; when busy, each step queues its kernel first, and that
    launch is counted with the step's, alike in every way)."""
    from torch.profiler import ProfilerActivity

    def queued_step() -> None:
        if device.type == "cuda" and busy_ms > 0:
            queue_kernel(device, busy_ms)
        step()

    per_step = profile_each_step(queued_step, device, PROFILED, [ProfilerActivity.CPU], lambda profiler: [
        (event.key, event.count, event.self_cpu_time_total) for event in profiler.key_averages()
        if not event.key.startswith("ProfilerStep")])  # the schedule's own record of each step
    totals: Dict[str, Dict[str, float]] = defaultdict(lambda: {"calls": 0.0, "us": 0.0})
    for events in per_step:
        for name, calls, us in events:
            totals[name]["calls"] += calls / PROFILED
            totals[name]["us"] += us / PROFILED
    return dict(totals)


def rebuild_plans(cache, plans: str) -> int:
    """Drops the execution plans kept after tuning and builds them again as --plans says ('caller': the warm-up
    steps build them; 'pool': prepare() does now); returns the plans prepare() made ready."""
    if plans == "search":
        return 0
    drop_plans(cache)
    return cache.prepare() if plans == "pool" else 0


def measure(workload: str, device: torch.device, rounds: int, busy_ms: float, profile: bool,
            deterministic: bool = False, plans: str = "search") -> dict:
    import cudnn_cache as cache

    initialise_libraries(device, cache)
    torch.use_deterministic_algorithms(deterministic)
    model, x, _ = model_and_input(WORKLOADS[workload], device, cache, convert=False)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()

    cache.set_miss_policy("tune")
    for way in WAYS[1:]:
        use(cache, way)
        step()
    cache.set_miss_policy("error")  # a convolution the tuning missed fails loudly instead of tuning in a round
    built_before = cache.stats()["plans_built"]
    prepared = rebuild_plans(cache, plans)
    states = {"idle": 0.0, "busy": busy_ms} if device.type == "cuda" else {"idle": 0.0}
    times: Dict[str, Dict[str, List[float]]] = {state: {way: [] for way in WAYS} for state in states}
    gpu: Dict[str, List[float]] = {way: [] for way in WAYS}
    for round_index in range(rounds):
        for way in in_turn(list(WAYS), round_index):
            use(cache, way)
            step()
            step()
            for state, queued in states.items():
                times[state][way].append(host_ms(step, device, queued))
            samples, _ = gpu_time_per_step(step, device, GPU_STEPS)  # None on the CPU
            if samples:
                gpu[way].append(statistics.median(samples))

    def row(figures: Dict[str, List[float]], way: str, name: str, **labels) -> dict:
        ratios = [mine / theirs for mine, theirs in zip(figures[way], figures["native"])]
        return {**labels, "way": way, name: median_interval(figures[way]), "ratio_to_native": median_interval(ratios)}

    rows = [row(times[state], way, "host_ms", state=state) for state in states for way in WAYS]
    gpu_rows = [row(gpu, way, "gpu_ms") for way in WAYS] if gpu["native"] else []
    result = {"workload": workload, "device": str(device), "rounds": rounds, "busy_ms": busy_ms,
              "deterministic": deterministic, "plans": plans, "plans_prepared": prepared,
              "plans_built_after_tuning": cache.stats()["plans_built"] - built_before,
              "rows": rows, "gpu_rows": gpu_rows}
    if profile:
        result["self_cpu_us"] = {state: {} for state in states}
        for state, queued in states.items():
            for way in WAYS:
                use(cache, way)
                step()
                result["self_cpu_us"][state][way] = self_cpu_us(step, device, queued)
    use(cache, "native")
    return result


def table(result: dict) -> str:
    def figure(value: Dict[str, float], digits: int) -> str:
        return f"{value['median']:.{digits}f} [{value['lo']:.{digits}f}, {value['hi']:.{digits}f}]"

    lines = ["| state | way | host ms per step, median [95%] | ÷ native, median of per-round ratios [95%] |",
             "|---|---|---|---|"]
    lines += [f"| {row['state']} | {row['way']} | {figure(row['host_ms'], 3)} | {figure(row['ratio_to_native'], 3)} |"
              for row in result["rows"]]
    if result.get("gpu_rows"):
        lines += ["", "| way | GPU ms per step, median [95%] | ÷ native, median of per-round ratios [95%] |",
                  "|---|---|---|"]
        lines += [f"| {row['way']} | {figure(row['gpu_ms'], 3)} | {figure(row['ratio_to_native'], 3)} |"
                  for row in result["gpu_rows"]]
    none = {"calls": 0.0, "us": 0.0}
    for state, ways in result.get("self_cpu_us", {}).items():
        def difference(name: str) -> float:  # the most any way's self time differs from native's
            return max(abs(ways[way].get(name, none)["us"] - ways["native"].get(name, none)["us"]) for way in WAYS)

        lines += ["", f"Self CPU us per step ({state}), calls in brackets; the {SHOWN} rows that differ most from "
                      "native's:", "", "| operator or call | " + " | ".join(WAYS) + " |", "|---|" + "---|" * len(WAYS)]
        for name in sorted(set().union(*ways.values()), key=difference, reverse=True)[:SHOWN]:
            cells = [f"{ways[way].get(name, none)['us']:.1f} ({ways[way].get(name, none)['calls']:.0f})"
                     for way in WAYS]
            lines.append(f"| {name[:70]} | " + " | ".join(cells) + " |")
        totals = [f"{sum(figures['us'] for figures in ways[way].values()):.0f}" for way in WAYS]
        lines.append("| total | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="seed",
                        help="a workload of scripts/bench.py (default seed)")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30; at least 6)")
    parser.add_argument("--busy-ms", type=float, default=60.0,
                        help="the kernel queued before a 'busy' step, in ms (default 60: longer than any bench step's "
                             "host time)")
    parser.add_argument("--profile", action="store_true", help="also each way's self CPU time per operator")
    parser.add_argument("--deterministic", action="store_true",
                        help="every way under torch.use_deterministic_algorithms(True)")
    parser.add_argument("--plans", choices=PLANS, default="search",
                        help="which execution plans the graph way runs: those kept after tuning (default), built "
                             "again on this thread's handle, or by prepare() on its pool's (a GPU only)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.busy_ms <= 0:
        parser.error("--busy-ms must be > 0: it is how long the GPU is kept busy before a 'busy' step")
    device = device_of(parser, args, "step_host_time")
    if device is None:
        return 2
    if args.plans != "search" and device.type != "cuda":
        parser.error(f"--plans {args.plans} needs a CUDA device: execution plans are the GPU path's")
    result = measure(args.workload, device, args.rounds, args.busy_ms, args.profile, args.deterministic, args.plans)
    print(f"{WORKLOADS[args.workload].label}: {args.rounds} rounds, {device}"
          f"{', deterministic' if args.deterministic else ''}, plans: {args.plans}"
          f" ({result['plans_built_after_tuning']} built after tuning, {result['plans_prepared']} prepared)\n")
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
