#!/usr/bin/env python3
"""One convolution tuned again and again in a fresh cache, each tuning audited: is a search's choice for one key
stable from tuning to tuning, and does it hold against native's picks?

bench.py's audit judges every key of a network once per tuning; where a key is found slower than native in
every audit, this takes that key alone. Each tuning clears the cache, tunes the convolution's three directions
with cudnn_cache.fill (with --tuning's options, e.g. exhaustive=1), reads the ranking of --direction, then
audits it --audit-repeats times in --audit-rounds interleaved rounds (bench_cases.summarize_audit judges each
audit as bench.py does: stored slower than the better native pick by more than 2% and by more than the key's
own resolution). Run it under CUDNN_CACHE_LOG=debug to see each search's paired rounds as well.

    python3 scripts/key_probe.py --input 64,208,14,14 --weight 208,8,3,3 --padding 1,1 --groups 26 \\
        --direction backward_filter --tuning exhaustive=1 --tunings 3 --json /tmp/probe.json

Prints a table per tuning and a summary (the configs stored, and how many audits found the stored one slower);
--json writes the same as JSON. Needs a CUDA GPU.
"""

import argparse
import collections
import json
import sys
import time
from typing import Callable, List

import torch

from bench_cases import (add_convolution_arguments, check_convolution, convolution_operands, summarize_audit,
                         tuning_arguments)

DIRECTIONS = ("forward", "backward_data", "backward_filter")


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_convolution_arguments(result)
    result.add_argument("--direction", choices=DIRECTIONS, required=True, help="whose ranking and audit to report")
    result.add_argument("--tunings", type=int, default=3, help="fresh tunings, each audited (default 3)")
    result.add_argument("--audit-repeats", type=int, default=2, help="audits per tuning (default 2)")
    result.add_argument("--audit-rounds", type=int, default=21, help="interleaved rounds per audit (default 21)")
    result.add_argument("--tuning", nargs="*", default=[], metavar="NAME=VALUE",
                        help="cudnn_cache.set_tuning_options for the tunings, e.g. exhaustive=1")
    result.add_argument("--top", type=int, default=5, help="ranking entries kept per tuning (default 5)")
    result.add_argument("--json", help="also write the results here")
    return result


def parse(argv: List[str]) -> argparse.Namespace:
    """The arguments, checked: the convolution's shapes must agree before any GPU time is spent."""
    command = parser()
    args = command.parse_args(argv)
    check_convolution(args, command.error)
    for name in ("tunings", "audit_repeats", "audit_rounds", "top"):
        if getattr(args, name) < 1:
            command.error(f"--{name.replace('_', '-')} must be at least 1")
    args.tuning = tuning_arguments(args.tuning, command.error)
    return args


def audited(row: dict) -> dict:
    """One audit's verdict on the key (a row that summarize_audit judged), in microseconds."""
    best = min(row["heuristic_ms"], row["benchmark_ms"])
    return {"stored_engine": row["stored_engine"], "stored_us": 1e3 * row["stored_mean_ms"],
            "heuristic_engine": row["heuristic_engine"], "heuristic_us": 1e3 * row["heuristic_ms"],
            "benchmark_engine": row["benchmark_engine"], "benchmark_us": 1e3 * row["benchmark_ms"],
            "resolution_us": row["resolution_us"], "stored_over_better_native": row["stored_mean_ms"] / best,
            "slower_than_native": row["slower_than_native"]}


def probe(cache, tune: Callable[[], None], key: tuple, args: argparse.Namespace) -> dict:
    """args.tunings tunings of the convolution (`tune` fills the cache), each audited args.audit_repeats times;
    `cache` is the cudnn_cache module (or a stand-in with its clear, set_tuning_options, tuning_options, query
    and audit)."""
    changed = {"repetitions", *args.tuning}  # what the probe sets, put back afterwards
    before = {name: value for name, value in cache.tuning_options().items() if name in changed}
    tunings = []
    try:
        for _ in range(args.tunings):
            cache.clear()
            cache.set_tuning_options(**dict(before, **args.tuning))
            start = time.perf_counter()
            tune()
            tune_s = time.perf_counter() - start
            ranking = cache.query(args.direction, key) or []
            cache.set_tuning_options(repetitions=args.audit_rounds)
            audits = []
            for _ in range(args.audit_repeats):
                rows = [row for row in summarize_audit(cache.audit())["rows"] if row["direction"] == args.direction]
                if len(rows) != 1:
                    raise RuntimeError(f"the audit has {len(rows)} {args.direction} rows; a fresh cache tuned for "
                                       "one convolution should have one")
                audits.append(audited(rows[0]))
            tunings.append({"tune_s": tune_s, "audits": audits,
                            "ranking": [{"engine": entry["engine"], "time_us": 1e3 * entry["time_ms"]}
                                        for entry in ranking[:args.top]]})
    finally:
        cache.set_tuning_options(**before)
    stored = collections.Counter(tuning["audits"][0]["stored_engine"] for tuning in tunings)
    return {"direction": args.direction, "tuning_options": args.tuning, "tunings": tunings,
            "stored_engines": dict(stored),
            "audits_slower": sum(a["slower_than_native"] for t in tunings for a in t["audits"]),
            "audits": sum(len(t["audits"]) for t in tunings),
            "tunings_slower_in_every_audit": sum(all(a["slower_than_native"] for a in t["audits"]) for t in tunings)}


def table(result: dict) -> str:
    """The result as Markdown: a row per audit, then the summary."""
    lines = ["| tuning | tune s | stored | stored us | heuristics' (us) | benchmark mode's (us) | ÷ better native "
             "| resolution us | slower |", "|---|---|---|---|---|---|---|---|---|"]
    for number, tuning in enumerate(result["tunings"], 1):
        for audit in tuning["audits"]:
            lines.append(f"| {number} | {tuning['tune_s']:.2f} | {audit['stored_engine']} | {audit['stored_us']:.2f} "
                         f"| {audit['heuristic_engine']} ({audit['heuristic_us']:.2f}) "
                         f"| {audit['benchmark_engine']} ({audit['benchmark_us']:.2f}) "
                         f"| {audit['stored_over_better_native']:.3f} | {audit['resolution_us']:.2f} "
                         f"| {'yes' if audit['slower_than_native'] else 'no'} |")
    stored = ", ".join(f"{engine} x{count}" for engine, count in result["stored_engines"].items())
    lines.append("")
    lines.append(f"{result['direction']}: stored {stored}; {result['audits_slower']} of {result['audits']} audits "
                 f"found the stored config slower than native; {result['tunings_slower_in_every_audit']} of "
                 f"{len(result['tunings'])} tunings slower in every audit")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("key_probe.py: needs a CUDA GPU (cuDNN's engines are timed there)", file=sys.stderr)
        return 2
    import cudnn_cache

    x, w = convolution_operands(args)
    conv = (list(args.stride), list(args.padding), list(args.dilation), args.groups)
    key = cudnn_cache.conv_key(args.direction, x, w, *conv)
    result = probe(cudnn_cache, lambda: cudnn_cache.fill(x, w, *conv), key, args)
    result["convolution"] = {"input": args.input, "weight": args.weight, "stride": args.stride,
                             "padding": args.padding, "dilation": args.dilation, "groups": args.groups,
                             "dtype": args.dtype, "channels_last": args.channels_last,
                             "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                             "cudnn": torch.backends.cudnn.version()}
    print(table(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
