"""Share tuning across ranks and machines with torch.distributed.

Every rank runs its first step under the ``record`` miss policy (cuDNN's heuristics run; each key that missed
is remembered), then calls :func:`sync`. The problems no rank holds are split so that each rank of a device
identity tunes about 1/N of them, and the entries are all-gathered, so every rank ends with the whole cache::

    torch.cuda.set_device(local_rank)                  # NCCL: each rank on its own GPU
    dist.init_process_group("nccl")
    if os.path.exists("convs.cache"):
        cudnn_cache.load("convs.cache")                # optional: what earlier runs tuned
    cudnn_cache.set_miss_policy("record")
    train_step(model, batch)                           # heuristics; every missed key is recorded
    cudnn_cache.distributed.sync()                     # tune 1/N each, share everything
    cudnn_cache.set_miss_policy("tune")
    if dist.get_rank() == 0:
        cudnn_cache.save("convs.cache")                # merged with the file, under its lock

The protocol is Note [Sharing tuning between processes] (extension/include/cudnn_cache/exchange.h); the guide
is docs/DISTRIBUTED.md. Ranks share tuning only with ranks of their identity (GPU name, compute capability, SM
count, cuDNN major.minor), since a ranking is valid only where it was measured; other identities' entries are
received too (unless ``keep_other_origins=False``) and kept under their own origin, unused here but saved. With
NCCL the bytes travel in CUDA tensors on the current device, so call ``torch.cuda.set_device`` first.

Without an initialised process group, sync() is a world of one: it tunes every recorded miss itself.
"""

import dataclasses
import hashlib
import logging
import math
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch

_ops = torch.ops.cudnn_cache
logger = logging.getLogger("cudnn_cache")

# (device name, compute capability major, minor, SM count, cuDNN major, minor).
Origin = Tuple[str, int, int, int, int, int]
# (backend, key): 'graph' or 'legacy', and the key as conv_key() gives it.
Problem = Tuple[str, Tuple[int, ...]]

_BACKENDS = ("graph", "legacy")  # the numbers the ops use for them

# Offsets into a key's int32 words (ConvolutionKey in extension/include/cudnn_cache/key.h): direction, then
# the input (data type, rank, 5 dims, 5 strides), the weight (data type, format, rank, 5 dims), the output.
_WEIGHT_RANK, _WEIGHT_DIMS = 15, 16
_OUTPUT_RANK, _OUTPUT_DIMS = 22, 23
_KEY_WORDS = 47


def device_origin(device: Optional[int] = None) -> Origin:
    """The identity of CUDA device `device` (default: the current one) and this process's cuDNN."""
    name, numbers = _ops.device_origin(device)
    return (name, *numbers)


def _origins(names: List[str], numbers: List[int]) -> List[Origin]:
    return [(name, *numbers[5 * i:5 * i + 5]) for i, name in enumerate(names)]


def recorded_misses() -> List[Tuple[Origin, str, Tuple[int, ...]]]:
    """The (origin, backend, key) of every pending key that is still not cached: the misses the 'record' policy
    remembered, and the pending keys of loaded files (cudnn_cache.tune_pending tunes this GPU's)."""
    names, numbers, rows = _ops.recorded_misses()
    origins = _origins(names, numbers)
    return [(origins[row[0]], _BACKENDS[row[1]], tuple(row[2:])) for row in rows.tolist()]


def pending_of(origin: Origin) -> List[Problem]:
    """The (backend, key) of every pending key of `origin` (recorded_misses()' of one GPU identity and cuDNN)."""
    return [(backend, key) for where, backend, key in recorded_misses() if where == origin]


def clear_recorded_misses() -> None:
    """Forgets every recorded miss (every pending key)."""
    _ops.clear_recorded_misses()


def estimated_cost(key: Sequence[int]) -> int:
    """A convolution's multiply-adds, the same in every direction: output elements x weight elements / output
    channels. Tuning time grows with it, so split() deals the costly problems out first."""
    weight = key[_WEIGHT_DIMS:_WEIGHT_DIMS + key[_WEIGHT_RANK]]
    output = key[_OUTPUT_DIMS:_OUTPUT_DIMS + key[_OUTPUT_RANK]]
    return math.prod(output) * math.prod(weight) // max(1, weight[0])


def split(problems: Iterable[Problem], ranks: Sequence[int]) -> Dict[int, List[Problem]]:
    """Deals the problems to the ranks: costliest first, in snake order (0..N-1, N-1..0, ...), so each rank
    gets len/N of them (give or take one) and about 1/N of the cost. Every rank computes the same split."""
    ranks = sorted(ranks)
    order = sorted(set(problems), key=lambda problem: (-estimated_cost(problem[1]), problem))
    plan: Dict[int, List[Problem]] = {rank: [] for rank in ranks}
    for index, problem in enumerate(order):
        lap, position = divmod(index, len(ranks))
        plan[ranks[position if lap % 2 == 0 else len(ranks) - 1 - position]].append(problem)
    return plan


def _key_id(origin: Origin, backend: str, key: Tuple[int, ...]) -> int:
    """A name for (origin, backend, key) that is the same in every process (unlike hash() of a str)."""
    text = repr((tuple(origin), backend, tuple(key))).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def _inventory() -> List[Tuple[Origin, str, int, Tuple[int, ...]]]:
    """(origin, backend, content digest, key) of every entry of this process's cache."""
    names, numbers, rows = _ops.inventory()
    origins = _origins(names, numbers)
    return [(origins[row[0]], _BACKENDS[row[1]], row[2], tuple(row[3:])) for row in rows.tolist()]


@dataclasses.dataclass
class SyncReport:
    """What sync() did on this rank."""

    rank: int
    world_size: int
    origin: Optional[Origin]  # this rank's identity; None without a GPU (it tunes nothing, only receives)
    peers: int  # ranks of this identity, this one included
    needed: int  # distinct problems of this identity that some rank of it needed
    untuned: int  # of those, held by no rank: tuned in this sync, split between the peers
    tuned: int  # by this rank
    failed: List[Tuple[str, Tuple[int, ...], str]]  # (backend, key, reason) this rank could not tune
    sent: int  # entries this rank sent
    received: int  # entries merged from the other ranks
    bytes_sent: int
    seconds: Dict[str, float]  # 'exchange' (needs and inventories), 'tune', 'share' (entries), 'total'


def _gather_objects(value, group, world_size: int) -> list:
    import torch.distributed as dist

    if world_size == 1:
        return [value]
    gathered = [None] * world_size
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def _gather_bytes(data: torch.Tensor, group, world_size: int) -> List[torch.Tensor]:
    """Every rank's uint8 tensor, via all_gather of the sizes and then of the bytes padded to the largest."""
    import torch.distributed as dist

    if world_size == 1:
        return [data]
    backend = str(dist.get_backend(group))
    device = torch.device("cpu")
    if "nccl" in backend and "gloo" not in backend:  # NCCL moves CUDA tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    size = torch.tensor([data.numel()], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size, group=group)
    counts = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(counts), dtype=torch.uint8, device=device)
    padded[:data.numel()] = data.to(device)
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(gathered, padded, group=group)
    return [tensor[:count].cpu() for tensor, count in zip(gathered, counts)]


def sync(group=None, *, problems: Optional[Iterable[Problem]] = None, origin: Optional[Origin] = None,
         device: Optional[int] = None, tune: Optional[Callable[[str, Tuple[int, ...]], None]] = None,
         keep_other_origins: bool = True) -> SyncReport:
    """Tunes what the ranks of `group` (default: the world) need, each rank about 1/N of it, and gives every
    rank every entry. A collective: every rank of the group must call it, with the same keep_other_origins.

    problems: the (backend, key) this rank needs; default: the misses the 'record' policy remembered on this
        rank's device that are still not cached.
    origin: the identity this rank tunes for; default: that of CUDA device `device` (the current one), or
        None without a GPU: such a rank tunes nothing and receives everything.
    tune: tunes one (backend, key) into this process's cache; default: cudnn_cache's search on tensors made
        from the key on `device`. A problem that fails to tune is reported (SyncReport.failed, and a
        warning), not raised, so that no rank is left waiting in a collective; it stays a recorded miss.
    keep_other_origins: also merge the entries of other identities (kept under their origin, never used on
        this GPU, saved with the file). With False a rank keeps only its own identity's.
    """
    started = time.perf_counter()
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed:
        rank, world_size = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
        if rank < 0:
            raise ValueError("cudnn_cache.distributed.sync: this process is not a member of the group it was "
                             "given; call sync() only on the group's ranks, or pass group=None for the world")
    else:
        rank, world_size = 0, 1
    if origin is None and torch.cuda.is_available():
        origin = device_origin(device)
    origin = None if origin is None else _checked_origin(origin)
    if problems is None:
        problems = pending_of(origin)
    needs = sorted({_checked_problem(problem) for problem in problems})
    if tune is None:
        def tune(backend: str, key: Tuple[int, ...]) -> None:
            _ops.tune_key(list(key), backend, device)

    # 1. Needs, identities and inventories: (key id, content digest) of every entry held.
    held_before = _inventory()
    digests_before = {digest for _, _, digest, _ in held_before}
    mine = {"origin": origin, "needs": needs,
            "held": [(_key_id(o, b, k), digest) for o, b, digest, k in held_before]}
    everyone = _gather_objects(mine, group, world_size)
    exchanged = time.perf_counter()

    peers: Dict[Origin, List[int]] = {}
    for r, theirs in enumerate(everyone):
        if theirs["origin"] is not None:
            peers.setdefault(tuple(theirs["origin"]), []).append(r)
    held_ids: Set[int] = {key_id for theirs in everyone for key_id, _ in theirs["held"]}
    needed = sorted({problem for r in peers.get(origin, []) for problem in everyone[r]["needs"]})
    untuned = [problem for problem in needed if _key_id(origin, *problem) not in held_ids]
    assignment = split(untuned, peers[origin]).get(rank, []) if origin is not None else []

    # 2. Tune this rank's share.
    failed = []
    for backend, key in assignment:
        try:
            tune(backend, key)
        except Exception as error:  # noqa: BLE001 -- reported; raising would leave the other ranks waiting
            failed.append((backend, key, _reason(error)))
    tuned = time.perf_counter()

    # 3. Send each entry some receiving rank lacks, once (by the lowest rank holding it), and all new ones.
    holders: Dict[int, int] = {}
    digests_of = [set() for _ in range(world_size)]
    for r, theirs in enumerate(everyone):
        for _, digest in theirs["held"]:
            holders.setdefault(digest, r)
            digests_of[r].add(digest)
    receivers_of: Dict[Optional[Origin], List[int]] = {}

    def receivers(entry_origin: Origin) -> List[int]:
        if entry_origin not in receivers_of:
            receivers_of[entry_origin] = [r for r, theirs in enumerate(everyone)
                                          if keep_other_origins or theirs["origin"] is None
                                          or tuple(theirs["origin"]) == entry_origin]
        return receivers_of[entry_origin]

    send = []
    for entry_origin, _, digest, _ in _inventory():
        if digest not in digests_before:
            send.append(digest)  # tuned now (or changed meanwhile): nobody has it
        elif holders.get(digest) == rank and any(digest not in digests_of[r] for r in receivers(entry_origin)):
            send.append(digest)
    data = _ops.export_entries(send)
    received = 0
    only = {} if keep_other_origins or origin is None else {"origin_name": origin[0], "origin_numbers": origin[1:]}
    for r, theirs in enumerate(_gather_bytes(data, group, world_size)):
        if r != rank:
            received += _ops.import_entries(theirs, f"the entries of rank {r}", **only)
    finished = time.perf_counter()

    report = SyncReport(rank=rank, world_size=world_size, origin=origin, peers=len(peers.get(origin, [])),
                        needed=len(needed), untuned=len(untuned), tuned=len(assignment) - len(failed),
                        failed=failed, sent=len(send), received=received, bytes_sent=int(data.numel()),
                        seconds={"exchange": exchanged - started, "tune": tuned - exchanged,
                                 "share": finished - tuned, "total": finished - started})
    if failed:
        import warnings

        warnings.warn(f"cudnn_cache.distributed.sync: rank {rank} could not tune {len(failed)} of its "
                      f"{len(assignment)} problems (first: {failed[0][0]} {failed[0][2]}); they stay recorded "
                      "misses and run with cuDNN's heuristics until tuned", RuntimeWarning, stacklevel=2)
    logger.info("sync: rank %d of %d tuned %d of %d untuned problems (%d needed by %d peer(s)), sent %d and "
                "received %d entries in %.2f s", rank, world_size, report.tuned, report.untuned, report.needed,
                report.peers, report.sent, report.received, report.seconds["total"])
    return report


def _checked_origin(origin) -> Origin:
    origin = tuple(origin)
    if len(origin) != 6 or not isinstance(origin[0], str) or not all(isinstance(n, int) for n in origin[1:]):
        raise ValueError(f"cudnn_cache.distributed.sync: origin must be (device name, compute capability major, "
                         f"minor, SM count, cuDNN major, minor), as device_origin() gives it; got {origin!r}")
    return origin


def _checked_problem(problem) -> Problem:
    try:
        backend, key = problem
        key = tuple(key)
    except (TypeError, ValueError):
        raise ValueError(f"cudnn_cache.distributed.sync: a problem is (backend, key), e.g. ('graph', "
                         f"cudnn_cache.conv_key(...)); got {problem!r}") from None
    if backend not in _BACKENDS:
        raise ValueError(f"cudnn_cache.distributed.sync: unknown backend {backend!r} in a problem; use 'graph' "
                         "or 'legacy'")
    if len(key) != _KEY_WORDS or not all(isinstance(word, int) for word in key):
        raise ValueError(f"cudnn_cache.distributed.sync: a key is the {_KEY_WORDS} ints conv_key() "
                         f"returns; got {len(key)} values")
    return backend, key


def _reason(error: BaseException) -> str:
    """The first line of an error, without the C++ frames PyTorch may append."""
    text = str(error).splitlines()[0] if str(error) else ""
    return text or type(error).__name__
