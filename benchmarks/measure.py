"""How the benchmarks' cases measure: synchronized wall time, an order drawn anew each round, the set-up before a
first step, and GPU time per step (torch.profiler, or replays of the step captured in a CUDA graph)."""

import random
import time
import warnings
from typing import Callable, List, Optional, Tuple

import torch


def in_turn(items: List[str], round_index: int) -> List[str]:
    """`items` in the order of round `round_index`: a permutation drawn from a generator seeded with the round
    index (so every run orders its rounds alike), so that no item always comes first and none always follows the
    same other. Rotation was not enough: it keeps the cyclic order, so an item always came after the same one.
    2026-12-03 on an H200, the overhead case's two native training rows, which run the same cuDNN plans (PyTorch's
    plan cache does not key by the benchmark flag), differed by 20 us per iteration with the benchmark row always
    right after the heuristics one, warm from it, and the heuristics row after a forward-only TorchScript loop."""
    order = list(items)
    random.Random(round_index).shuffle(order)
    return order


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_call(function: Callable[[], object], device: torch.device) -> Tuple[object, float]:
    """(function(), its wall seconds), with the device synchronized before and after."""
    synchronize(device)
    started = time.perf_counter()
    value = function()
    synchronize(device)
    return value, time.perf_counter() - started


def timed(function: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of function(), with the device synchronized before and after."""
    return timed_call(function, device)[1]


def initialise_libraries(device: torch.device, cache=None) -> None:
    """Runs a tiny convolution forward and backward, natively and (given the cudnn_cache module) through the
    cache under the 'heuristic' policy, which stores nothing: CUDA, cuBLAS, cuDNN and the ops are set up before
    the first step."""
    x = torch.rand(1, 1, 5, 5, device=device, requires_grad=True)
    w = torch.rand(1, 1, 2, 2, device=device)
    torch.nn.functional.conv2d(x, w).sum().backward()
    if cache is not None:
        cache.set_miss_policy("heuristic")
        cache.functional.conv2d(x, w).sum().backward()
    synchronize(device)


# Note [Profiling last]
# ~~~~~~~~~~~~~~~~~~~~~
# torch.profiler's CUDA activity attaches CUPTI to the process, and Kineto may leave it attached when the session
# ends: it calls cuptiFinalize only where TEARDOWN_CUPTI=1 (pytorch/pytorch#144455: a program stays 10-20%
# slower after profiling; kineto#1539 proposes tearing down by default). While CUPTI is attached every kernel
# launch pays its callbacks on the host, so whatever a process measures after a profiled step it measures in a
# process unlike a user's, and not alike for every engine config: one that launches a kernel per group and a
# memset pays many times what one that launches a single kernel pays. So a case times its wall steps, then
# audits, then replays its step in a CUDA graph, and profiles last: an audit run after profiled steps found
# engine configs slower that were faster or tied when their key was timed alone.


def profile_each_step(step: Callable[[], None], device: torch.device, steps: int, activities: list,
                      measure: Callable[[object], object]) -> list:
    """measure(profiler) of each of `steps` steps, each profiled on its own: torch.profiler's schedule cycles
    through one untraced warm-up step and one traced step, and hands each traced step to measure (its
    on_trace_ready), so 2 x steps steps run. The step is synchronized before its trace closes."""
    from torch.profiler import profile, schedule

    measured = []
    with warnings.catch_warnings():
        # It warns that each cycle starts with no events: what makes each measurement one step's.
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=1, repeat=steps),
                     on_trace_ready=lambda profiler: measured.append(measure(profiler))) as profiler:
            for _ in range(2 * steps):
                step()
                synchronize(device)
                profiler.step()
    return measured


def gpu_time_per_step(step: Callable[[], None], device: torch.device, steps: int) -> Optional[List[float]]:
    """Milliseconds the GPU spends running kernels and copies in each of `steps` steps, each profiled on its own
    (profile_each_step); None on the CPU. Against the wall step, it tells slower kernels from host time the GPU
    waits on."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity

    def busy_ms(profiler) -> float:
        return sum(event.self_device_time_total for event in profiler.key_averages()) / 1e3

    return profile_each_step(step, device, steps, [ProfilerActivity.CUDA], busy_ms)


# Note [GPU time without a profiler]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# gpu_ms is what torch.profiler's CUDA activity records, and CUPTI attached to the process changes what it
# measures: on an H100 one runtime-compiled engine config of RegNetY took 3-4 us more per call after a profiler
# session (12.0 against 15.5 us, timed without the profiler), and an engine that launches a kernel per group pays
# its per-kernel cost many times (Note [Profiling last]). graph_ms attaches nothing: the step is captured once in
# a CUDA graph (warmed up first on the side stream it is captured on; captured in thread-local mode, so that
# another thread's CUDA calls do not end it) and each replay is timed by CUDA events around it: the GPU's time for
# the step, gaps between kernels included, with the host out of the way. A step that cannot be captured (a host
# synchronization, an operator CUDA graphs do not support) has no graph_ms, and graph_error says why.
# A capture that fails leaves PyTorch's default CUDA generator marked as capturing (torch 2.11 clears the mark only
# when a capture ends well), and every random op after it raises "Offset increment outside graph capture
# encountered unexpectedly" (seen on the H100 on 2026-12-07, where it made 40 later tests of a process fail); so a
# failed capture is followed by one that succeeds, which clears the mark.
GRAPH_WARMUP = 3  # steps on the side stream before the capture, and replays before the timed ones


def graph_time_per_step(step: Callable[[], None], device: torch.device,
                        steps: int) -> Tuple[Optional[List[float]], Optional[str]]:
    """Milliseconds of each of `steps` replays of the step captured in a CUDA graph (Note [GPU time without a
    profiler]), and None; (None, None) on the CPU; (None, why) where the step cannot be captured."""
    if device.type != "cuda":
        return None, None
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream(device)
    capturing = False  # from the capture's start until it ends well
    try:
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # what a library sets up per stream is set up before the capture
            for _ in range(GRAPH_WARMUP):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        capturing = True
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            step()
        capturing = False
        for _ in range(GRAPH_WARMUP):
            graph.replay()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        synchronize(device)
        return [start.elapsed_time(end) for start, end in events], None
    except Exception as error:  # noqa: BLE001 - the case goes on without this clock, and says why
        synchronize(device)
        if capturing:  # a capture that succeeds clears what the failed one left set
            cleared = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cleared, stream=side, capture_error_mode="thread_local"):
                torch.zeros(1, device=device)
            cleared.reset()
        return None, f"{type(error).__name__}: {error}".splitlines()[0][:300]
    finally:
        graph.reset()  # its memory pool goes back to the allocator before the profiled steps
