#!/usr/bin/env python3
"""Warm start: tune every convolution of a model once, and write the cache file that later runs load.

Runs forward and backward on the GPU for each input shape and batch size, which fills the forward,
backward-data and backward-filter caches, then saves them atomically. An existing file is loaded first, so
entries accumulate across runs (and across models).

    python3 scripts/warm_start.py --model resnet50 --shape 3,224,224 --batch-size 32 --output resnet50.cache
    python3 scripts/warm_start.py --model resnet50 --shape 3,224,224 --batch-size 64 --dtype bfloat16 \\
        --channels-last --output resnet50.cache
    python3 scripts/warm_start.py --torchscript model.pt --shape 3,32,32 --batch-size 7 --output model.cache
    torchrun --nproc-per-node 8 scripts/warm_start.py --model resnet50 --shape 3,224,224 --batch-size 32 \\
        --output resnet50.cache
    python3 scripts/warm_start.py --model resnet50 --shape 3,224,224 --batch-size 32 --exhaustive \\
        --output resnet50.cache
    python3 scripts/warm_start.py --pending shapes.cache
    python3 scripts/warm_start.py --pending shapes.cache --jobs 4
    python3 scripts/warm_start.py --model resnet50 --shape 3,224,224 --batch-size 32 --deterministic \\
        --output resnet50.cache

--exhaustive times every engine config cuDNN offers for each convolution (heuristics modes A and B and the
fallback list, and a wider knob neighbourhood: the tuning option exhaustive=True), minutes where the default
takes seconds, for CI or a one-off tuning job whose file every later run loads. It searches every key of the
model again, whether or not the file holds it, and the save merges with the file (per key, the faster
measurement of each candidate wins).

--settle (the default with --exhaustive; --no-settle turns it off) decides every key again after the tuning
steps, before the save (cudnn_cache.settle): each stored choice and native's two picks timed as
cudnn_cache.audit times them, and a native pick the rounds show faster takes the stored choice's place; such an
entry replaces the file's for its key in the save, where other entries merge. A search decides inside the step
that missed, under the tuning's own load; keys of a few microseconds are where that shows. It takes a second or
two; on an H100 it left no key slower than native in both of two audits, where the unsettled file had 0-2, and
left the step's GPU time unchanged (`python3 -m benchmarks models --settle` measures it).

--deterministic is for a file that deterministic training (torch.use_deterministic_algorithms, or
cudnn.deterministic) will load: each search also settles the deterministic configs against native's deterministic
picks in its paired rounds (the tuning option rank_deterministic=True), as a deterministic call's own miss would;
searches take longer. Keys the file already holds are not searched again; with --pending too.

--pending FILE tunes FILE's pending keys instead of a model's convolutions: the shapes a training run met and did
not tune (the 'record' miss policy, Note [Pending keys]), for this GPU's identity, saved into FILE (merged). It is
`cudnn_cache tune FILE`, and under torchrun the ranks split the keys as they do a model's. --jobs N tunes them in N
worker processes instead, spread over this GPU model's GPUs, each merging its entries into FILE (Note [Tuning in
worker processes] in torch_ops/cudnn_cache/_tune_jobs.py; the same code as `cudnn_cache tune FILE --jobs N`).

--remote URL shares the tuning through a Redis store (cudnn_cache.set_remote, Note [Remote store]): this GPU's
entries there are merged after the file is loaded (or instead of it, where there is none yet), and the saved file's
entries are pushed to it, each merged on the server. A store that cannot be reached costs one warning.

Under torchrun (WORLD_SIZE > 1) each rank takes GPU LOCAL_RANK and runs the model once under the 'record'
miss policy (cuDNN's heuristics, every missed key remembered); cudnn_cache.distributed.sync() then has each
rank tune about 1/N of the keys and gives every rank all of them, and rank 0 saves the file (merged with what
it holds, under its lock). Ranks with different GPU models tune for their own model each.

Exit codes: 0 done; 1 the model or a file failed; 2 bad arguments, or no GPU (nothing is written then).
"""

import argparse
import itertools
import os
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "torch_ops"))  # a source checkout

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def parse_shape(text: str):
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be comma-separated integers such as 3,224,224, not {text!r}")
    if not 2 <= len(shape) <= 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: give C,L or C,H,W or C,D,H,W (no batch), all >= 1")
    return shape


def parse_args(argv):
    from cudnn_cache._tune_jobs import jobs_argument
    from cudnn_cache.remote import url_argument

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a torchvision model name, e.g. resnet50 (built with random weights)")
    source.add_argument("--torchscript", help="a TorchScript file whose convolutions use the cudnn_cache ops")
    source.add_argument("--pending", metavar="FILE",
                        help="tune the pending keys of this cache file, into it, instead of a model's convolutions")
    parser.add_argument("--shape", type=parse_shape, action="append",
                        help="input shape without the batch, e.g. 3,224,224; repeat for several")
    parser.add_argument("--batch-size", type=int, action="append", help="repeat for several")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--channels-last", action="store_true", help="run in channels_last (NHWC / NDHWC)")
    parser.add_argument("--output",
                        help="the cache file to write (loaded first if it exists, unless --exhaustive); with "
                             "--pending, FILE itself")
    parser.add_argument("--exhaustive", action="store_true",
                        help="time every engine config cuDNN offers, not the first ten (offline: minutes)")
    parser.add_argument("--settle", action=argparse.BooleanOptionalAction,
                        help="after the tuning steps, decide every key again in steady state (cudnn_cache.settle): "
                             "a native pick the audit's rounds show faster takes the stored config's place "
                             "(default: on with --exhaustive)")
    parser.add_argument("--deterministic", action="store_true",
                        help="for deterministic training: also settle the deterministic configs of each key against "
                             "native's deterministic picks (longer searches)")
    parser.add_argument("--remote", metavar="URL", type=url_argument,
                        help="a Redis store shared by many machines: redis://[[user]:password@]host[:port][/db] or "
                             "rediss://; its entries of this GPU are merged in, the file's entries pushed to it")
    parser.add_argument("--device", default="cuda",
                        help="CUDA device, default: the current one (under torchrun: cuda:LOCAL_RANK)")
    parser.add_argument("--jobs", type=jobs_argument, default=1, metavar="N",
                        help="with --pending: tune in N worker processes, each 1/N of the keys, spread over this GPU "
                             "model's GPUs unless --device names one (default 1: in this process)")
    args = parser.parse_args(argv)
    if args.settle is None:  # an exhaustive search is offline: a second or two more decides its keys where they run
        args.settle = args.exhaustive
    if args.pending is not None:
        if args.shape or args.batch_size or args.exhaustive or args.channels_last:
            parser.error("--pending tunes the file's own keys: it takes no --shape, --batch-size, --exhaustive or "
                         "--channels-last")
        if args.output not in (None, args.pending):
            parser.error("--pending FILE writes FILE itself; leave out --output")
        args.output = args.pending
        if args.jobs > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            parser.error("--jobs N starts worker processes of its own; under torchrun the ranks split the keys "
                         "already: leave out --jobs, or run one process")
        return args
    if args.jobs != 1:
        parser.error("--jobs N tunes a file's pending keys: give --pending FILE, or leave out --jobs")
    for option, value in (("--shape", args.shape), ("--batch-size", args.batch_size), ("--output", args.output)):
        if not value:
            parser.error(f"{option} is required with --model or --torchscript")
    if min(args.batch_size) < 1:
        parser.error("--batch-size must be >= 1")
    return args


def build_model(args, device, dtype):
    import cudnn_cache

    if args.model:
        try:
            import torchvision
        except ImportError:
            sys.exit("warm_start: --model needs torchvision (pip install torchvision==0.26.0)")
        try:
            model = torchvision.models.get_model(args.model, weights=None)
        except ValueError as error:
            sys.exit(f"warm_start: {error}")
        model = cudnn_cache.convert(model)
    else:
        model = torch.jit.load(args.torchscript, map_location=device)
        if "cudnn_cache::" not in str(model.inlined_graph):
            sys.exit(f"warm_start: {args.torchscript} calls no cudnn_cache op; run cudnn_cache.convert(model) "
                     "before torch.jit.script, so its convolutions go through the cache")
    model = model.to(device=device, dtype=dtype)
    return model.train()


def first_tensor_sum(output):
    """A scalar to backpropagate from whatever the model returns."""
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    if isinstance(output, dict):
        output = list(output.values())
    return sum(first_tensor_sum(item) for item in output if isinstance(item, (torch.Tensor, list, tuple, dict)))


def progress(items, total):
    try:
        from tqdm import tqdm
        return tqdm(items, total=total, unit="shape", desc="warm start")
    except ImportError:
        def plain():
            for index, item in enumerate(items, 1):
                print(f"warm start [{index}/{total}] batch {item[1]} x {item[0]}", flush=True)
                yield item
        return plain()


def join_process_group():
    """Under torchrun: this rank's GPU (LOCAL_RANK) and the NCCL process group; None in a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= torch.cuda.device_count():
        sys.exit(f"warm_start: LOCAL_RANK {local_rank} but this machine shows {torch.cuda.device_count()} GPUs; "
                 "run torchrun with --nproc-per-node at most the number of GPUs")
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    return torch.device("cuda", local_rank)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("warm_start: no CUDA GPU is visible; cuDNN tuning needs one. Nothing was written.", file=sys.stderr)
        return 2
    import cudnn_cache

    if args.remote is not None:
        cudnn_cache.set_remote(args.remote)
    rank_device = join_process_group()
    try:
        return warm_start(args, cudnn_cache, rank_device)
    finally:
        if rank_device is not None:
            import torch.distributed as dist

            dist.destroy_process_group()


def tune_pending_keys(args, cudnn_cache, rank_device) -> int:
    """--pending: the file's pending keys of this GPU, tuned here (or split between the ranks) and saved into it."""
    distributed = rank_device is not None
    device = rank_device if distributed else torch.device(args.device)
    started = time.perf_counter()
    if not os.path.exists(args.pending):
        print(f"warm_start: --pending {args.pending}: no such file", file=sys.stderr)
        return 1
    options = {"rank_deterministic": True} if args.deterministic else {}
    if options:
        cudnn_cache.set_tuning_options(**options)
    if not distributed:
        from cudnn_cache._tune_jobs import tune_file

        # --device cuda:D names one GPU; without an index --jobs' workers spread over every GPU of this one's model.
        tuned = tune_file(args.pending, jobs=args.jobs, device=device.index, options=options)["tuned"]
        settled = settle(args, cudnn_cache, device)
        cudnn_cache.save(args.pending)
        print(f"warm_start: tuned {tuned} pending keys of {args.pending} in {time.perf_counter() - started:.1f} s"
              f"{settled}; {len(cudnn_cache.distributed.recorded_misses())} still pending (other GPUs' or cuDNNs')")
        return 0
    cudnn_cache.load(args.pending)
    return sync_and_save(args, cudnn_cache, device, started)


def warm_start(args, cudnn_cache, rank_device) -> int:
    if args.pending is not None:
        return tune_pending_keys(args, cudnn_cache, rank_device)
    distributed = rank_device is not None
    device = rank_device if distributed else torch.device(args.device)
    dtype = DTYPES[args.dtype]
    started = time.perf_counter()
    # An exhaustive run searches every key again: what the file holds was (most likely) found by a shorter search.
    if os.path.exists(args.output) and not args.exhaustive:
        loaded = cudnn_cache.load(args.output)  # and the remote store's entries of this GPU, with --remote
    else:
        loaded = 0 if args.exhaustive else cudnn_cache.pull_remote()
    if args.exhaustive or args.deterministic:
        cudnn_cache.set_tuning_options(exhaustive=args.exhaustive, rank_deterministic=args.deterministic)
    model = build_model(args, device, dtype)
    cudnn_cache.reset_stats()

    memory_format = torch.contiguous_format
    if args.channels_last:
        memory_format = {3: torch.channels_last, 4: torch.channels_last_3d}.get(len(args.shape[0]))
        if memory_format is None:
            print("warm_start: --channels-last needs 2-D or 3-D inputs (C,H,W or C,D,H,W)", file=sys.stderr)
            return 2
        model = model.to(memory_format=memory_format)

    runs = list(itertools.product(args.shape, args.batch_size))
    policy = cudnn_cache.miss_policy()
    if distributed:
        cudnn_cache.set_miss_policy("record")  # heuristics now; the misses are tuned by sync(), split
    try:
        for shape, batch in progress(runs, len(runs)):
            x = torch.randn(batch, *shape, device=device, dtype=dtype).contiguous(memory_format=memory_format)
            first_tensor_sum(model(x)).backward()
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
    finally:
        cudnn_cache.set_miss_policy(policy)

    if not distributed:
        settled = settle(args, cudnn_cache, device)
        written = cudnn_cache.save(args.output)
        stats = cudnn_cache.stats()
        print(f"warm_start: {written} entries in {args.output} ({stats['tunes']} tuned now, {loaded} loaded{settled}); "
              f"{len(runs)} shape(s) in {time.perf_counter() - started:.1f} s")
        return 0
    return sync_and_save(args, cudnn_cache, device, started)


def settle(args, cudnn_cache, device) -> str:
    """With --settle, after the tuning steps: decides every entry again in steady state (cudnn_cache.settle,
    Note [Settling in steady state]); returns the words the summary line gains."""
    if not args.settle:
        return ""
    started = time.perf_counter()
    rows = cudnn_cache.settle(device.index)
    changed = sum(row["changed"] for row in rows)
    return f"; {changed} of {len(rows)} settled to another config in {time.perf_counter() - started:.1f} s"


def sync_and_save(args, cudnn_cache, device, started) -> int:
    """Under torchrun: the ranks split what some rank needs (recorded misses, pending keys) and rank 0 saves."""
    import torch.distributed as dist

    report = cudnn_cache.distributed.sync()
    torch.cuda.synchronize(device)
    if report.rank == 0:
        settled = settle(args, cudnn_cache, device)
        written = cudnn_cache.save(args.output)
        where = f"rank 0 wrote {written} entries to {args.output}{settled}"
    else:
        where = "rank 0 writes the file"
    dist.barrier()
    print(f"warm_start: rank {report.rank} of {report.world_size} ({device}) tuned {report.tuned} of the "
          f"{report.untuned} untuned keys ({report.needed} needed, {report.peers} rank(s) of this GPU model) in "
          f"{report.seconds['tune']:.1f} s, received {report.received} entries; {where}; "
          f"{time.perf_counter() - started:.1f} s in all", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
