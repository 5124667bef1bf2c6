"""The models benchmark's chart: grouped bars per workload (needs matplotlib)."""

import math
import pathlib

from benchmarks.cases import MODES
from benchmarks.report import successful, workload_label

def plot(report: dict, path: pathlib.Path) -> bool:
    """Grouped bars per workload, on log scales: steady step and first step per mode, and (when cache_warm ran)
    cache_warm's warm start against the native first steps. Returns False, saying why, when matplotlib is
    missing or no training case succeeded."""
    ok = successful(report["cases"])
    if not ok:
        print(f"bench: no successful training case to chart; skipping {path}")
        return False
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"bench: matplotlib is not installed; skipping the chart {path} (pip install matplotlib)")
        return False
    workloads = list(dict.fromkeys(c["workload"] for c in report["cases"]))
    modes = [m for m in MODES if any(c["mode"] == m for c in report["cases"])]
    panels = [("steady step (ms, median)", [(m, m, "steady_ms") for m in modes]),  # title, [(label, mode, key)]
              ("first step (s)", [(m, m, "first_s") for m in modes])]
    if any("warm_start_s" in case for case in ok.values()):
        natives = [m for m in ("native_benchmark", "native_heuristic") if m in modes]
        panels.append(("start-up (s): native first steps, cache_warm's load + prepare + first step",
                       [(f"{m} first step", m, "first_s") for m in natives]
                       + [("cache_warm warm start", "cache_warm", "warm_start_s")]))
    figure, axes = plt.subplots(len(panels), 1, figsize=(max(8.0, 2.2 * len(workloads)), 4.5 * len(panels)),
                                constrained_layout=True)
    for axis, (title, series) in zip(axes, panels):
        width = 0.8 / len(series)
        for index, (label, mode, key) in enumerate(series):
            values = [ok.get((w, mode), {}).get(key) for w in workloads]
            values = [math.nan if v is None else v for v in values]
            positions = [i + (index - (len(series) - 1) / 2) * width for i in range(len(workloads))]
            bars = axis.bar(positions, values, width, label=label, color=f"C{list(MODES).index(mode)}")
            axis.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.3g}" for v in values], fontsize=7,
                           rotation=90, padding=2)
        axis.set_yscale("log")
        axis.set_title(title)
        axis.set_xticks(range(len(workloads)))
        axis.set_xticklabels([workload_label(w) for w in workloads], fontsize=8, rotation=15, ha="right")
        axis.margins(y=0.25)
        axis.legend(fontsize=8)
    env = report["environment"]
    figure.suptitle(f"cudnn_cache ({report['settings']['backend']}) vs native cuDNN: {env['gpu']}, "
                    f"torch {env['torch']}, cuDNN {env['cudnn']}")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True

