"""One rank of the distributed tests (test_distributed.py), on the CPU with gloo: it joins a process group
through a file store, sets up the cache a scenario asks for, runs cudnn_cache.distributed.sync() with a tuner
that stores synthetic rankings (there is no GPU to time on), and writes what happened as JSON.

    python distributed_worker.py SCENARIO RANK WORLD_SIZE STORE_FILE OUT_DIR
"""

import hashlib
import json
import pathlib
import sys
import time

import torch
import torch.distributed as dist

import cudnn_cache
import testing_ops
from cudnn_cache import distributed

ORIGIN_A = ("Test GPU A", 9, 0, 132, 9, 19)
ORIGIN_B = ("Test GPU B", 8, 0, 108, 9, 19)
_ops = torch.ops.cudnn_cache


def problems(count: int, offset: int = 0):
    """`count` distinct (backend, key) problems: 2-D convolutions of growing width, three directions, both
    backends. Keys come from conv_key on meta tensors, as a model's would."""
    result = []
    i = offset
    while len(result) < count:
        channels, batch = 8 + 8 * (i % 13), 1 + i // 13
        x = torch.empty(batch, channels, 16, 16, device="meta")
        w = torch.empty(channels, channels, 3, 3, device="meta")
        for direction in ("forward", "backward_data", "backward_filter"):
            for backend in ("graph", "legacy"):
                result.append((backend, cudnn_cache.conv_key(direction, x, w, [1], [1], [1], 1)))
        i += 1
    return result[:count]


def seed_of(key) -> int:
    return int.from_bytes(hashlib.blake2b(repr(tuple(key)).encode(), digest_size=4).digest(), "little")


def add_ranking(origin, problem, seed: int) -> None:
    backend, key = problem
    testing_ops.add_synthetic_ranking(list(key), backend, origin[0], list(origin[1:]), seed)


class Tuner:
    """Stores a synthetic ranking where a search would store a measured one, and remembers what it tuned."""

    def __init__(self, origin):
        self.origin = origin
        self.tuned = []

    def __call__(self, backend, key):
        self.tuned.append([backend, list(key)])
        add_ranking(self.origin, (backend, key), seed_of(key))


def state():
    """This rank's cache, as (origin, backend, key, digest) lists, sorted."""
    entries = distributed._inventory()
    return sorted([list(origin), backend, list(key), digest] for origin, backend, digest, key in entries)


def split_scenario(rank, world_size, out):
    """All ranks of one identity. Each needs a shared pool and some problems of its own; rank 0 already holds a
    few (loaded from a file, say), which nobody may tune."""
    pool = problems(60)
    own = problems(4, offset=100 + 10 * rank)
    held = pool[:6]
    if rank == 0:
        for problem in held:
            add_ranking(ORIGIN_A, problem, 7)
    tuner = Tuner(ORIGIN_A)
    report = distributed.sync(problems=pool + own, origin=ORIGIN_A, tune=tuner)
    return {"tuned": tuner.tuned, "report": vars(report), "state": state(),
            "held": [[b, list(k)] for b, k in held], "needed": [[b, list(k)] for b, k in pool + own]}


def mixed_scenario(rank, world_size, out, keep_other_origins):
    """Ranks 0, 1 are GPU A, ranks 2, 3 GPU B, rank 4 has no GPU. All need the same problems."""
    origin = [ORIGIN_A, ORIGIN_A, ORIGIN_B, ORIGIN_B, None][rank]
    tuner = Tuner(origin)
    needed = problems(30) if origin is not None else []
    report = distributed.sync(problems=needed, origin=origin, tune=tuner, keep_other_origins=keep_other_origins)
    return {"tuned": tuner.tuned, "report": vars(report), "state": state(), "origin": origin}


def merge_scenario(rank, world_size, out):
    """Ranks 0 and 1 each tuned the same problems on their own (different measurements); rank 2 has nothing.
    Each saves its cache first, so the test can compare the result with python -m cudnn_cache merge."""
    shared = problems(12)
    if rank < 2:
        for problem in shared:
            add_ranking(ORIGIN_A, problem, 100 * rank + seed_of(problem[1]) % 97)
    cudnn_cache.save(pathlib.Path(out) / f"before-{rank}.cache", merge=False)
    report = distributed.sync(problems=shared, origin=ORIGIN_A, tune=Tuner(ORIGIN_A))
    cudnn_cache.save(pathlib.Path(out) / f"after-{rank}.cache", merge=False)
    return {"report": vars(report), "state": state()}


def bulk_scenario(rank, world_size, out):
    """Timing: every rank holds 1000 entries of its own, and needs 60 problems nobody holds."""
    testing_ops.add_synthetic_entries(1000, 1 + rank, f"Test GPU of rank {rank}", [9, 0, 132, 9, 19])
    started = time.perf_counter()
    report = distributed.sync(problems=problems(60), origin=ORIGIN_A, tune=Tuner(ORIGIN_A))
    return {"report": vars(report), "entries": cudnn_cache.size(), "seconds": time.perf_counter() - started}


def main(argv):
    scenario, rank, world_size, store_file, out = argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5]
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world_size)
    try:
        if scenario == "split":
            result = split_scenario(rank, world_size, out)
        elif scenario in ("mixed", "mixed-own-only"):
            result = mixed_scenario(rank, world_size, out, keep_other_origins=scenario == "mixed")
        elif scenario == "merge":
            result = merge_scenario(rank, world_size, out)
        elif scenario == "bulk":
            result = bulk_scenario(rank, world_size, out)
        else:
            raise SystemExit(f"unknown scenario {scenario!r}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    (pathlib.Path(out) / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)
