"""The C++ core's micro-benchmarks (tests/bench/bench_core.cpp, Google Benchmark) against their targets.

Writes the raw Google Benchmark JSON and a summary to bench-results/core.json and prints the table; with --check,
exits 1 when a target is missed.
"""

import argparse
import json
import pathlib
import platform
import subprocess
import sys
import time

from benchmarks import ROOT, add_arguments, output_paths, parse, write_result
from benchmarks.performance_doc import render_core

TARGETS = {  # benchmark name -> (what it measures, target, unit)
    "key_from_values": ("key from plain values", 200.0, "ns"),
    "key_from_descriptors": ("key decoded from descriptors", None, "ns"),
    "descriptors_from_key": ("the legacy backend's four descriptors made from a key (each call)", None, "ns"),
    "cache_find_hit": ("cache find, hit (10k entries)", 100.0, "ns"),
    "graph_cache_find_hit": ("graph-API cache find, hit (10k entries)", 100.0, "ns"),
    "cache_find_miss": ("cache find, miss (10k entries)", 100.0, "ns"),
    "plan_cache_get_hit": ("plan cache lookup, hit (1k entries)", 100.0, "ns"),
    # Note [Each thread's own hits]: a call's lookups through the shared caches, and through its thread's memo.
    "hit_lookup_shared": ("a hit's lookups through the shared caches (ranking, count, plan)", None, "ns"),
    "hit_lookup_memo": ("a hit's lookups through the thread's memo", 100.0, "ns"),
    # Two threads taking turns, as a training step's forward and backward threads do: per turn of both.
    "hit_lookup_in_turn/0/real_time": ("two threads in turn: the hand-over alone", None, "ns"),
    "hit_lookup_in_turn/1/real_time": ("two threads in turn: hand-over + a shared-cache hit each", None, "ns"),
    "hit_lookup_in_turn/2/real_time": ("two threads in turn: hand-over + a memo hit each", None, "ns"),
    "save_10k": ("save of 10k entries, replacing the file", None, "ms"),
    "save_10k_merging": ("save of 10k entries, merged with a file of the same 10k", None, "ms"),
    "load_10k": ("load of 10k entries", 20.0, "ms"),
    "load_100k": ("load of 100k entries", 150.0, "ms"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser, "core.json")
    parser.add_argument("--build-dir", default=str(ROOT / "build"))
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parse(parser, argv)
    binary = pathlib.Path(args.build_dir) / "tests" / "cudnn_cache_bench"
    if not binary.exists():
        sys.exit(f"{binary} is missing: build with scripts/build.sh (needs Debian's libbenchmark-dev)")
    report = json.loads(subprocess.run([str(binary), "--benchmark_format=json",
                                        f"--benchmark_repetitions={args.repetitions}",
                                        "--benchmark_report_aggregates_only=true"],
                                       check=True, capture_output=True, text=True).stdout)
    rows = []
    for name, (label, target, unit) in TARGETS.items():
        median = next(b for b in report["benchmarks"] if b["run_name"] == name and b["aggregate_name"] == "median")
        assert median["time_unit"] == unit, (name, median["time_unit"])
        verdict = "-" if target is None else ("met" if median["real_time"] <= target else "MISSED")
        rows.append({"benchmark": name, "what": label, "median": median["real_time"], "unit": unit, "target": target,
                     "verdict": verdict})
    summary = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "cpu": report["context"].get("num_cpus"),
               "rows": rows, "google_benchmark": report}
    text = "\n".join(render_core(summary))
    write_result(summary, output_paths("core.json", args.output, args.update), text)
    print(text)
    return 1 if args.check and any(row["verdict"] == "MISSED" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
