"""Runs the core micro-benchmarks (tests/bench/bench_core.cpp) and checks them against their targets.

Writes the raw Google Benchmark JSON plus a summary to bench-results/core.json (--json to move it, --update:
benchmarks/results/core.json too) and prints a markdown table. With --check, exits 1 when a target is missed.
"""

import argparse
import json
import pathlib
import platform
import subprocess
import sys
import time

from benchmarks import ROOT, output_paths, write_result

# benchmark name -> (what it measures, target, unit)
TARGETS = {
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
    parser.add_argument("--build-dir", default=str(ROOT / "build"))
    parser.add_argument("--json", help="the result file (default bench-results/core.json)")
    parser.add_argument("--update", action="store_true", help="also write benchmarks/results/core.json")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)

    binary = pathlib.Path(args.build_dir) / "tests" / "cudnn_cache_bench"
    if not binary.exists():
        sys.exit(f"{binary} is missing: build with scripts/build.sh (needs Debian's libbenchmark-dev)")
    raw = subprocess.run(
        [str(binary), "--benchmark_format=json", f"--benchmark_repetitions={args.repetitions}",
         "--benchmark_report_aggregates_only=true"],
        check=True, capture_output=True, text=True).stdout
    report = json.loads(raw)

    rows, missed = [], []
    for name, (label, target, unit) in TARGETS.items():
        median = next(b for b in report["benchmarks"] if b["run_name"] == name and b["aggregate_name"] == "median")
        assert median["time_unit"] == unit, (name, median["time_unit"])
        value = median["real_time"]
        verdict = "-" if target is None else ("met" if value <= target else "MISSED")
        if verdict == "MISSED":
            missed.append(name)
        rows.append({"benchmark": name, "what": label, "median": value, "unit": unit, "target": target,
                     "verdict": verdict})

    summary = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "cpu": report["context"].get("num_cpus"),
               "rows": rows, "google_benchmark": report}
    paths = output_paths("core.json", args.json, args.update)
    write_result(summary, paths)

    print("| benchmark | median | target | verdict |")
    print("|---|---|---|---|")
    for row in rows:
        target = "-" if row["target"] is None else f"<= {row['target']:g} {row['unit']}"
        print(f"| {row['what']} | {row['median']:.1f} {row['unit']} | {target} | {row['verdict']} |")
    print(f"\nJSON: {', '.join(map(str, paths))}")
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
