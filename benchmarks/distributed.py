"""Distributed tuning, measured: how long N ranks take to tune a model's convolutions with
cudnn_cache.distributed.sync(), against one rank doing it all (needs N GPUs of one machine, NCCL).

For each world size, fresh processes (one per GPU, nothing cached) run one forward and backward under the
'record' miss policy, then sync(): the untuned keys are split between the ranks, tuned, and all-gathered. It
prints one JSON object: per world size the keys, what each rank tuned, the tuning and sync times (the slowest
rank's), and whether all ranks ended with the same entries; then the speedup of each world size over one rank.

    python3 -m benchmarks distributed                                  # ResNet-50, batch 32, 1 and 2 GPUs
    python3 -m benchmarks distributed --world-sizes 1,2,4 --dtype bfloat16 --channels-last --output r.json

Writes bench-results/distributed.json (--output to move it, --update: benchmarks/results/distributed.json too).

Exit codes: 0 done; 1 a run failed or its ranks disagree; 2 bad arguments or too few GPUs.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import torch

from benchmarks import output_paths, write_result

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", help="a torchvision model name (random weights)")
    parser.add_argument("--shape", default="3,224,224", help="input shape without the batch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--backend", choices=["graph", "legacy"], default=None, help="default: cudnn_cache's")
    parser.add_argument("--world-sizes", default="1,2", help="comma-separated, e.g. 1,2,4")
    parser.add_argument("--output", help="the result file (default bench-results/distributed.json)")
    parser.add_argument("--update", action="store_true", help="also write benchmarks/results/distributed.json")
    args = parser.parse_args(argv)
    try:
        args.shape = tuple(int(v) for v in args.shape.split(","))
        args.world_sizes = [int(v) for v in args.world_sizes.split(",")]
    except ValueError:
        parser.error("--shape and --world-sizes take comma-separated integers, e.g. --shape 3,224,224")
    if min(args.world_sizes) < 1 or args.batch_size < 1:
        parser.error("--world-sizes and --batch-size must be >= 1")
    return args


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
        # The cache must now cover the model: the error policy proves it on a second step.
        cudnn_cache.set_miss_policy("error")
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()
        torch.cuda.synchronize(device)
        result = {"rank": rank, "record_s": recorded, "report": report.__dict__, "tunes": cudnn_cache.stats()["tunes"],
                  "tune_us": cudnn_cache.stats()["tune_us"], "entries": cudnn_cache.size(), "digests": digests}
        (pathlib.Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_world(args, world_size):
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="cudnn_cache_bench_distributed.") as folder:
        started = time.perf_counter()
        mp.spawn(rank_main, args=(world_size, args, os.path.join(folder, "store"), folder), nprocs=world_size)
        wall = time.perf_counter() - started
        ranks = [json.loads(pathlib.Path(folder, f"rank{r}.json").read_text()) for r in range(world_size)]
    reports = [r["report"] for r in ranks]
    return {
        "world_size": world_size,
        "keys_needed": reports[0]["needed"],
        "keys_untuned": reports[0]["untuned"],
        "tuned_per_rank": [r["tuned"] for r in reports],
        "failed": sum(len(r["failed"]) for r in reports),
        "tune_s": max(r["seconds"]["tune"] for r in reports),
        "sync_s": max(r["seconds"]["total"] for r in reports),
        "exchange_s": max(r["seconds"]["exchange"] for r in reports),
        "share_s": max(r["seconds"]["share"] for r in reports),
        "record_s": max(r["record_s"] for r in ranks),
        "bytes_sent": sum(r["bytes_sent"] for r in reports),
        "entries": [r["entries"] for r in ranks],
        "consistent": all(r["digests"] == ranks[0]["digests"] for r in ranks),
        "processes_wall_s": wall,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    available = torch.cuda.device_count()
    if available < max(args.world_sizes):
        print(f"distributed: --world-sizes needs {max(args.world_sizes)} GPUs, this machine shows {available}",
              file=sys.stderr)
        return 2
    runs = [run_world(args, world_size) for world_size in args.world_sizes]
    baseline = next((run for run in runs if run["world_size"] == 1), None)
    result = {
        "model": args.model, "batch_size": args.batch_size, "shape": list(args.shape), "dtype": args.dtype,
        "channels_last": args.channels_last, "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "runs": runs,
        "tune_speedup": {str(run["world_size"]): baseline["tune_s"] / run["tune_s"]
                         for run in runs} if baseline else {},
        "sync_speedup": {str(run["world_size"]): baseline["sync_s"] / run["sync_s"]
                         for run in runs} if baseline else {},
    }
    print(json.dumps(result, indent=2))
    write_result(result, output_paths("distributed.json", args.output, args.update))
    ok = all(run["consistent"] and run["failed"] == 0 for run in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
