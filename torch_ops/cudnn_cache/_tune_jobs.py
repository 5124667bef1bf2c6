"""A cache file's pending keys tuned in worker processes: `python -m cudnn_cache tune FILE --jobs N` and
`scripts/warm_start.py --pending FILE --jobs N` both run tune_file().

Note [Tuning in worker processes]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A search is CPU work (heuristics' queries, plan builds, NVRTC compilations of 50-250 ms for the engines cuDNN
compiles at run time) around GPU work (the timing), and cuDNN's compilations do not overlap between the threads
of one process. Offline, where the keys are known ahead (a file's pending keys, Note [Pending keys]) and no
training step runs beside the searches, the parallelism that pays is the simplest: N processes, each with its own
CUDA context and cuDNN, tune 1/N of the keys. shares() deals them out as distributed.sync() deals keys to ranks
(distributed.split: costliest first, in snake order), so every key is in exactly one share. The workers spread
over the GPUs of the tuning GPU's identity (name, compute capability, SM count; a ranking is valid only there),
round robin; several on one GPU overlap one's compilations with another's timing, and their timings share that
GPU. Each worker starts with an empty cache, tunes its share one key after another (no key after the deadline
of --max-seconds), and saves into the file with cudnn_cache.save's merge under the file's lock, as any
processes sharing a file do; a key another worker saved meanwhile stays. The parent loads the file again
afterwards, so it holds what every worker tuned. Nothing here runs inside a training process: the workers are
started by the command lines only. With one job the keys are tuned in the calling process.
"""

import argparse
import multiprocessing
import time
from typing import Dict, Iterable, List, Optional, Sequence

import torch

from . import distributed
from .distributed import Problem, _reason

# A worker holds a CUDA context (about half a GB of GPU memory) and cuDNN's handles; more than this many on one
# machine is a mistake, not a plan.
MAX_JOBS = 64


def jobs_fix() -> str:
    """What to do about a bad --jobs, for every message that refuses one."""
    return f"give a number of worker processes from 1 to {MAX_JOBS} (1, the default, tunes in this process)"


def jobs_argument(text: str) -> int:
    """An argparse type for --jobs: a decimal integer from 1 to MAX_JOBS."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of worker processes: {jobs_fix()}")
    return int(text)


def check_jobs(jobs) -> int:
    """`jobs` if it is an int from 1 to MAX_JOBS; else ValueError naming it and the fix."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"cudnn_cache tune: jobs={jobs!r} is not a number of worker processes: {jobs_fix()}")
    return jobs


def shares(problems: Iterable[Problem], jobs: int) -> List[List[Problem]]:
    """The distinct problems dealt into at most `jobs` shares (distributed.split's deal: costliest first, in
    snake order), each in exactly one; shares that would be empty (fewer problems than jobs) are left out."""
    dealt = distributed.split(problems, range(check_jobs(jobs)))
    return [dealt[job] for job in range(jobs) if dealt[job]]


def worker_devices(workers: int, devices: Sequence[int]) -> List[int]:
    """The CUDA device of each of `workers` workers: `devices` in turn, round robin."""
    if not devices:
        raise ValueError("cudnn_cache tune: no CUDA device to start workers on")
    return [devices[worker % len(devices)] for worker in range(workers)]


def tuning_devices(device: Optional[int]) -> List[int]:
    """The GPUs the workers spread over: `device` alone where named; else the current GPU and every other
    visible GPU of its identity (Note [Tuning in worker processes])."""
    if device is not None:
        return [device]
    current = torch.cuda.current_device()
    origin = distributed.device_origin(current)
    return [current] + [other for other in range(torch.cuda.device_count())
                        if other != current and distributed.device_origin(other) == origin]


def tune_file(path: str, jobs: int = 1, device: Optional[int] = None, max_seconds: Optional[float] = None,
              options: Optional[Dict] = None) -> Dict:
    """Loads the cache file at `path` into this process's cache and tunes its pending keys of the identity of
    CUDA device `device` (default: the current one): here with jobs=1, else in `jobs` worker processes, which
    merge their entries into the file (Note [Tuning in worker processes]); this process's cache then holds the
    file and what was tuned, for the caller to save. `options` are tuning options (set_tuning_options) for the
    workers; with jobs=1 the caller sets them here. Returns {"tuned": keys tuned, "workers": one dict per worker
    (device, keys: its share's size, tuned, tunes: the searches it ran), none with jobs=1}. Raises RuntimeError
    naming a worker that failed, after the others have saved."""
    import cudnn_cache

    check_jobs(jobs)
    if max_seconds is not None and not max_seconds >= 0:
        raise ValueError(f"cudnn_cache tune: max_seconds must be a number of seconds >= 0 or None, not "
                         f"{max_seconds!r}")
    cudnn_cache.load(path)
    if jobs == 1:
        return {"tuned": cudnn_cache.tune_pending(max_seconds=max_seconds, device=device), "workers": []}
    deadline = None if max_seconds is None else time.time() + max_seconds
    devices = tuning_devices(device)
    dealt = shares(distributed.pending_of(distributed.device_origin(devices[0])), jobs)
    workers = [{"device": worker_device, "keys": len(share)}
               for worker_device, share in zip(worker_devices(len(dealt), devices), dealt)]
    results = _run_workers(path, dealt, [worker["device"] for worker in workers], deadline, options or {})
    failures = []
    for index, (worker, result) in enumerate(zip(workers, results)):
        worker.update(tuned=result.get("tuned", 0), tunes=result.get("tunes", 0))
        if "error" in result:
            failures.append(f"worker {index} (cuda:{worker['device']}, {worker['keys']} keys): {result['error']}")
    cudnn_cache.load(path)  # what the workers merged into it
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(workers)} workers failed; what the others tuned is in "
                           f"{path}: {'; '.join(failures)}")
    return {"tuned": sum(worker["tuned"] for worker in workers), "workers": workers}


def _run_workers(path: str, dealt: List[List[Problem]], devices: List[int], deadline: Optional[float],
                 options: Dict) -> List[Dict]:
    """Starts one process per share (spawned: each makes its own CUDA context) and returns what each reported:
    {"tuned", "tunes"}, and "error" where it failed or ended without a report."""
    context = multiprocessing.get_context("spawn")
    started = []
    for share, worker_device in zip(dealt, devices):
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=_work, args=(sender, path, share, worker_device, deadline, options),
                                  name=f"cudnn_cache tune worker on cuda:{worker_device}")
        process.start()
        sender.close()  # the worker's end: receive() sees EOF once the worker is gone
        started.append((process, receiver))
    results = []
    for process, receiver in started:
        try:
            result = receiver.recv()
        except EOFError:
            result = None
        process.join()
        receiver.close()
        if result is None:
            result = {"error": f"it ended with exit code {process.exitcode} before reporting"}
        results.append(result)
    return results


def _work(sender, path: str, share: List[Problem], device: int, deadline: Optional[float], options: Dict) -> None:
    """A worker process: tunes `share` on `device` from an empty cache and merges the entries into `path`; sends
    {"tuned", "tunes"} and, where tuning or the save failed, "error" (what it tuned until then is saved)."""
    report: Dict = {}
    try:
        import cudnn_cache

        torch.cuda.set_device(device)
        cudnn_cache.clear()
        cudnn_cache.reset_stats()
        if options:
            cudnn_cache.set_tuning_options(**options)
        try:
            remaining = None if deadline is None else max(0.0, deadline - time.time())
            cudnn_cache._tune_in_turn(share, device, remaining)
        except Exception as error:  # noqa: BLE001 -- reported with its share; what was tuned is saved below
            report["error"] = _reason(error)
        report.update(tuned=cudnn_cache.size(), tunes=cudnn_cache.stats()["tunes"])
        if report["tuned"]:
            cudnn_cache.save(path)  # merged with the file under its lock
    except BaseException as error:  # noqa: BLE001 -- the parent reports it
        report["error"] = _reason(error)
    finally:
        sender.send(report)
        sender.close()
