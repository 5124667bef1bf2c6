"""Distributed tuning: how long N ranks take to tune a model's convolutions with cudnn_cache.distributed.sync(),
against one rank doing it all (needs N GPUs of one machine, NCCL).

For each world size, fresh processes (one per GPU, nothing cached) run one forward and backward under the
'record' miss policy, then sync(): the untuned keys are split between the ranks, tuned and all-gathered; a second
step under the 'error' policy proves the cache covers the model. Per world size: the keys, what each rank tuned,
the tuning and sync times (the slowest rank's), whether all ranks ended with the same entries; and each world
size's speed-up over one rank.

    python3 -m benchmarks distributed                                  # ResNet-50, batch 32, 1 and 2 GPUs
    python3 -m benchmarks distributed --world-sizes 1,2,4 --dtype bfloat16 --channels-last

Writes bench-results/distributed.json. Exit codes: 0 done; 1 a run failed or its ranks disagree; 2 bad arguments
or too few GPUs.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import torch

from benchmarks import add_arguments, output_paths, parse, write_result
from benchmarks.performance_doc import render_distributed

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def rank_main(rank, world_size, args, store_path, out_dir):
    """One rank: record the model's keys, sync, and write what happened to out_dir/rank<r>.json."""
    import torch.distributed as dist
    import torchvision

    import cudnn_cache

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                            device_id=device)
    try:
        if args.backend:
            cudnn_cache.set_backend(args.backend)
        dtype = DTYPES[args.dtype]
        model = cudnn_cache.convert(torchvision.models.get_model(args.model, weights=None))
        model = model.to(device=device, dtype=dtype).train()
        x = torch.randn(args.batch_size, *args.shape, device=device, dtype=dtype)
        if args.channels_last:
            model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
        cudnn_cache.set_miss_policy("record")
        started = time.perf_counter()
        model(x).float().sum().backward()
        torch.cuda.synchronize(device)
        recorded = time.perf_counter() - started
        cudnn_cache.reset_stats()
        dist.barrier()
        report = cudnn_cache.distributed.sync()
        torch.cuda.synchronize(device)
        digests = sorted(digest for _, _, digest, _ in cudnn_cache.distributed._inventory())
        cudnn_cache.set_miss_policy("error")  # the cache must now cover the model: a second step proves it
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()
        torch.cuda.synchronize(device)
        stats = cudnn_cache.stats()
        result = {"rank": rank, "record_s": recorded, "report": report.__dict__, "tunes": stats["tunes"],
                  "tune_us": stats["tune_us"], "entries": cudnn_cache.size(), "digests": digests}
        (pathlib.Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_world(args, world_size: int) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="cudnn_cache_bench_distributed.") as folder:
        started = time.perf_counter()
        mp.spawn(rank_main, args=(world_size, args, os.path.join(folder, "store"), folder), nprocs=world_size)
        wall = time.perf_counter() - started
        ranks = [json.loads(pathlib.Path(folder, f"rank{r}.json").read_text()) for r in range(world_size)]
    reports = [r["report"] for r in ranks]
    slowest = {f"{name}_s": max(r["seconds"][name] for r in reports) for name in ("tune", "exchange", "share")}
    return {"world_size": world_size, "keys_needed": reports[0]["needed"], "keys_untuned": reports[0]["untuned"],
            "tuned_per_rank": [r["tuned"] for r in reports], "failed": sum(len(r["failed"]) for r in reports),
            **slowest, "sync_s": max(r["seconds"]["total"] for r in reports),
            "record_s": max(r["record_s"] for r in ranks), "bytes_sent": sum(r["bytes_sent"] for r in reports),
            "entries": [r["entries"] for r in ranks], "consistent": all(r["digests"] == ranks[0]["digests"] for r in ranks),
            "processes_wall_s": wall}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, "distributed.json")
    add = parser.add_argument
    add("--model", default="resnet50", help="a torchvision model name (random weights)")
    add("--shape", default="3,224,224", help="input shape without the batch")
    add("--batch-size", type=int, default=32)
    add("--dtype", choices=sorted(DTYPES), default="float32")
    add("--channels-last", action="store_true")
    add("--backend", choices=["graph", "legacy"], default=None, help="default: cudnn_cache's")
    add("--world-sizes", default="1,2", help="comma-separated, e.g. 1,2,4")
    args = parse(parser, argv)
    try:
        args.shape = tuple(int(v) for v in args.shape.split(","))
        args.world_sizes = [int(v) for v in args.world_sizes.split(",")]
    except ValueError:
        parser.error("--shape and --world-sizes take comma-separated integers, e.g. --shape 3,224,224")
    if min(args.world_sizes) < 1 or args.batch_size < 1:
        parser.error("--world-sizes and --batch-size must be >= 1")
    if torch.cuda.device_count() < max(args.world_sizes):
        print(f"distributed: --world-sizes needs {max(args.world_sizes)} GPUs, this machine shows "
              f"{torch.cuda.device_count()}", file=sys.stderr)
        return 2
    runs = [run_world(args, world_size) for world_size in args.world_sizes]
    baseline = next((run for run in runs if run["world_size"] == 1), None)
    result = {"model": args.model, "batch_size": args.batch_size, "shape": list(args.shape), "dtype": args.dtype,
              "channels_last": args.channels_last, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "runs": runs}
    for name in ("tune", "sync"):
        result[f"{name}_speedup"] = {str(run["world_size"]): baseline[f"{name}_s"] / run[f"{name}_s"]
                                     for run in runs} if baseline else {}
    text = "\n".join(render_distributed(result)) if baseline else json.dumps(runs, indent=1)
    write_result(result, output_paths("distributed.json", args.output, args.update), text)
    print(text)
    return 0 if all(run["consistent"] and run["failed"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
