"""Real training workloads, native PyTorch and cudnn_cache side by side, each case in a fresh process.

Workloads (models built with weights=None and seeded, synthetic data made before the first step):
    detection   Faster R-CNN R50-FPN, 5 classes, fp32, batch 2, 1-3 random boxes an image, SGD; the image size changes
                every step (480x640, 512x704, 544x736, 608x800, each kept by the transform): an epoch, one step a size
    speech      torchaudio wav2vec2_base (layer drop 0, for steadier steps), bf16 autocast, batch 4, SGD on the
                features' mean square; 8 clip lengths evenly in 1-4 s at 16 kHz: an epoch, one step a length
    gan         DCGAN (100-d noise -> 3x64x64), fp32, batch 64, a discriminator and a generator Adam update a step
    dense       DenseNet-121, bf16 autocast, channels_last, batch 32, 224x224, SGD
    grouped     ResNeXt-50 32x4d, as dense (and shufflenet, ShuffleNetV2 x1.0, not run by default)
Modes; the cache modes as a user runs them: CUDNN_CACHE_PATH set for the process, which imports cudnn_cache (the
import loads the file and routes PyTorch's convolutions through the cache; the exit saves the file):
    native_benchmark   cudnn.benchmark=True (for detection and dense only if --modes names it: see DEFAULT_SKIP)
    native_heuristics  cudnn.benchmark=False
    cache_cold         a new file, miss policy 'tune'     cache_nearest   another new file, CUDNN_CACHE_MISS_POLICY=nearest
    cache_warm         the file this round's cache_cold saved
Every case runs with CUDA_CACHE_DISABLE=1 (no driver JIT cache, as on a fresh machine) unless --keep-jit-cache,
and reports: its first step (from the loop's start, and from the process's); epochs 1 and 2; the steady step
(fixed shapes: --steps after --warmup; changing shapes: the mean step of --steady-epochs more epochs), wall and
GPU (CUDA events around each step, synchronized at its end), median and 95% interval (stats.py;
min-max under 6 values); peak GPU memory; cudnn_cache.stats() in the cache modes. The events time the stream
from the step's first work to its last, idle gaps included: a step whose host lags behind its GPU reads about
its wall time there. That the untuned policies run native heuristics' very kernels (the same GPU busy time) is
what tests/python/test_ops_gpu.py::test_untuned_misses_run_the_kernels_native_heuristics_run checks.
Targets: (1) cache_nearest steady GPU <= 1.00x native_heuristics' ('within noise' up to 1 + the upper spread of
native's interval), its first epoch <= 1.05x; (2) cache_warm steady wall <= 1.00x the better native mode's (the
lower median), the median of per-round ratios; (3) changing shapes: cache_warm's first epoch <= 2x its second;
(4) cache_cold's peak reserved memory <= 1.2x native_heuristics'.

    python3 -m benchmarks real-workloads --workloads gan,grouped --modes native_heuristics,cache_cold,cache_warm --rounds 3
    python3 -m benchmarks real-workloads --report bench-results/a.json bench-results/b.json   # parts, no run

Writes --output (bench-results/real_workloads.json, a .md beside it) after every case ("complete": false until
the end), with --update also benchmarks/results/. Exit: 0 all ran, 1 some case failed (recorded, the run goes
on), 2 bad arguments or no GPU.
"""

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import traceback

T0 = time.perf_counter()  # before torch is imported: start_to_first_step_s counts from here
import torch  # noqa: E402  (CUDA starts at the first CUDA call, after a case has set its environment)

from benchmarks import case_command as module_command, output_paths, run_subprocess  # noqa: E402
from benchmarks.stats import median_interval  # noqa: E402

NAME = "real_workloads.json"  # the result file, in bench-results/ (and benchmarks/results/ with --update)
WORKLOADS = {  # name -> (label, batch, fixed shape)
    "detection": ("Faster R-CNN R50-FPN fp32 bs2, 4 image sizes", 2, False),
    "speech": ("wav2vec2 base bf16 bs4, 8 lengths 1-4 s", 4, False),
    "gan": ("DCGAN 64x64 fp32 bs64", 64, True),
    "dense": ("DenseNet-121 bf16 channels_last bs32", 32, True),
    "grouped": ("ResNeXt-50 32x4d bf16 channels_last bs32", 32, True),
    "shufflenet": ("ShuffleNetV2 x1.0 bf16 channels_last bs32", 32, True),
}
DEFAULT_WORKLOADS = ("detection", "speech", "gan", "dense", "grouped")
MODES = ("native_benchmark", "native_heuristics", "cache_cold", "cache_nearest", "cache_warm")  # the run's order
NATIVE = MODES[:2]
# Left out unless --modes names them, to fit a run in minutes: benchmark mode times every convolution shape it
# meets (detection: 4 sizes of ~50 convolutions; DenseNet: ~65 distinct shapes), most slowly without a JIT cache.
DEFAULT_SKIP = {"detection": ("native_benchmark",), "dense": ("native_benchmark",)}
DETECTION_SIZES = ((480, 640), (512, 704), (544, 736), (608, 800), (448, 576), (576, 768), (640, 832), (416, 544))
CLASSIFIERS = {"dense": "densenet121", "grouped": "resnext50_32x4d", "shufflenet": "shufflenet_v2_x1_0"}
OWN_VARIABLES = ("CUDNN_CACHE_PATH", "CUDNN_CACHE_MISS_POLICY", "CUDNN_CACHE_INTERCEPT")  # the modes set them

# --- The workloads: each builder returns an epoch's steps (one per shape; one for a fixed shape) ---------------


def training_step(optimizer, loss_of):
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        optimizer.step()
        return loss
    return step


def detection(args, device, batch):
    from torchvision.models.detection import fasterrcnn_resnet50_fpn

    model = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=5).to(device).train()
    optimizer, generator = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9), torch.Generator()
    generator.manual_seed(args.seed)
    steps = []
    for h, w in DETECTION_SIZES[:args.shapes or 4]:
        h, w, images, targets = max(32, int(h * args.scale)), max(32, int(w * args.scale)), [], []
        for _ in range(batch):
            images.append(torch.rand(3, h, w, generator=generator).to(device))
            count = int(torch.randint(1, 4, (1,), generator=generator))
            corner = torch.rand(count, 2, generator=generator) * torch.tensor([w, h]) * 0.5
            extent = (0.1 + 0.4 * torch.rand(count, 2, generator=generator)) * torch.tensor([w, h])
            targets.append({"boxes": torch.cat([corner, corner + extent], 1).to(device),
                            "labels": torch.randint(1, 5, (count,), generator=generator).to(device)})

        def loss_of(h=h, w=w, images=images, targets=targets):
            # the shorter side as min_size, the longer as max_size: the transform scales by 1, keeping the size
            model.transform.min_size, model.transform.max_size = (min(h, w),), max(h, w)
            return sum(model(images, targets).values())
        steps.append(training_step(optimizer, loss_of))
    return steps


def speech(args, device, batch):
    try:
        import torchaudio
    except ImportError as error:
        raise RuntimeError(f"the speech workload needs torchaudio, which cannot be imported here ({error})") from None
    model = torchaudio.models.wav2vec2_base(encoder_layer_drop=0.0).to(device).train()
    optimizer, generator = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), torch.Generator()
    generator.manual_seed(args.seed)
    count, steps = args.shapes or 8, []
    for i in range(count):
        waves = torch.randn(batch, int(args.scale * 16000 * (1 + 3 * i / max(1, count - 1))), generator=generator)

        def loss_of(waves=waves.to(device)):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                features, _ = model(waves)
            return features.float().pow(2).mean()
        steps.append(training_step(optimizer, loss_of))
    return steps


def dcgan(noise: int = 100, width: int = 64):
    """The DCGAN generator (noise -> 3x64x64) and discriminator (-> one logit), initialised as in the paper."""
    from torch import nn

    def up(i, o, stride=2, padding=1):
        return [nn.ConvTranspose2d(i, o, 4, stride, padding, bias=False), nn.BatchNorm2d(o), nn.ReLU(True)]

    def down(i, o, norm=True):
        return [nn.Conv2d(i, o, 4, 2, 1, bias=False), *([nn.BatchNorm2d(o)] if norm else []), nn.LeakyReLU(0.2, True)]

    g = nn.Sequential(*up(noise, 8 * width, 1, 0), *up(8 * width, 4 * width), *up(4 * width, 2 * width),
                      *up(2 * width, width), nn.ConvTranspose2d(width, 3, 4, 2, 1, bias=False), nn.Tanh())
    d = nn.Sequential(*down(3, width, False), *down(width, 2 * width), *down(2 * width, 4 * width),
                      *down(4 * width, 8 * width), nn.Conv2d(8 * width, 1, 4, 1, 0, bias=False), nn.Flatten())
    for module in [*g.modules(), *d.modules()]:
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(module.weight, 0.0, 0.02)
    return g, d


def gan(args, device, batch):
    from torch.nn.functional import binary_cross_entropy_with_logits as bce

    g, d = (model.to(device).train() for model in dcgan())
    opt_g, opt_d = (torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.5, 0.999)) for model in (g, d))
    real = torch.rand(batch, 3, 64, 64, generator=torch.Generator().manual_seed(args.seed)).to(device) * 2 - 1
    ones, zeros = torch.ones(batch, 1, device=device), torch.zeros(batch, 1, device=device)

    def step():
        fake = g(torch.randn(batch, 100, 1, 1, device=device))
        training_step(opt_d, lambda: bce(d(real), ones) + bce(d(fake.detach()), zeros))()
        return training_step(opt_g, lambda: bce(d(fake), ones))()
    return [step]


def classifier(name: str):
    def build(args, device, batch):
        import torchvision
        from torch.nn.functional import cross_entropy

        model = getattr(torchvision.models, CLASSIFIERS[name])(weights=None)
        model = model.to(device).train().to(memory_format=torch.channels_last)
        generator, size = torch.Generator().manual_seed(args.seed), max(32, int(224 * args.scale))
        x = torch.rand(batch, 3, size, size, generator=generator).to(device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), generator=generator).to(device)

        def loss_of():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                return cross_entropy(model(x), y)
        return [training_step(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), loss_of)]
    return build


BUILDERS = {"detection": detection, "speech": speech, "gan": gan, **{name: classifier(name) for name in CLASSIFIERS}}

# --- One case (--case WORKLOAD:MODE), in its own process --------------------------------------------------------


def case_environment(mode: str, cache_file, keep_jit_cache: bool = False) -> dict:
    """The variables a case's process runs with, as a user would set them."""
    env = {} if keep_jit_cache else {"CUDA_CACHE_DISABLE": "1"}
    if mode.startswith("cache_"):
        env["CUDNN_CACHE_PATH"] = str(cache_file)
        if mode == "cache_nearest":
            env["CUDNN_CACHE_MISS_POLICY"] = "nearest"
    return env


def summary(values) -> dict:
    """median_interval, or the median with min and max where 95% needs more values."""
    if len(values) >= 6:
        return median_interval(values)
    return {"median": statistics.median(values), "lo": min(values), "hi": max(values), "n": len(values)}


def measure(workload: str, mode: str, args, result: dict) -> None:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.backends.cudnn.benchmark = mode == "native_benchmark"
    if mode.startswith("cache_"):  # the zero-code path: CUDNN_CACHE_PATH is set, the script imports the package
        began = time.perf_counter()
        import cudnn_cache
        result.update(import_s=time.perf_counter() - began, cache_file=cudnn_cache.active_file(),
                      loaded_entries=cudnn_cache.size(), miss_policy=cudnn_cache.miss_policy(),
                      intercepting=cudnn_cache.intercepting())
    result.update(cudnn_cache_imported="cudnn_cache" in sys.modules,
                  jit_cache_disabled=os.environ.get("CUDA_CACHE_DISABLE") == "1")
    began = time.perf_counter()
    torch.manual_seed(args.seed)
    steps = BUILDERS[workload](args, device, args.batch or WORKLOADS[workload][1])
    sync()
    result["setup_s"] = time.perf_counter() - began
    if cuda:
        result.update(device=torch.cuda.get_device_name(), cudnn=torch.backends.cudnn.version())
    losses = []

    def timed(step):  # (wall ms, GPU ms) of one step
        began = time.perf_counter()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        losses[:] = [step()]
        if cuda:
            end.record()
        sync()
        return 1e3 * (time.perf_counter() - began), start.elapsed_time(end) if cuda else None

    fixed = WORKLOADS[workload][2]
    length = args.epoch_steps if fixed else len(steps)

    def epoch(count):  # (wall s, each step's times, its start)
        began = time.perf_counter()
        times = [timed(steps[i % len(steps)]) for i in range(count)]
        sync()
        return time.perf_counter() - began, times, began

    (first_s, first, loop_began), (second_s, second, _) = epoch(length), epoch(length)
    result.update(first_step_s=first[0][0] / 1e3, start_to_first_step_s=loop_began - T0 + first[0][0] / 1e3,
                  first_epoch_s=first_s, second_epoch_s=second_s,
                  epoch_steps_ms=[[round(wall, 3) for wall, _ in times] for times in (first, second)])
    if fixed:
        for _ in range(args.warmup):
            timed(steps[0])
        samples = epoch(args.steps)[1]
    else:  # the mean step of each steady epoch
        samples = [(statistics.fmean(w for w, _ in times), statistics.fmean(g for _, g in times) if cuda else None)
                   for times in (epoch(length)[1] for _ in range(args.steady_epochs))]
    result.update(steady_wall_ms=summary([wall for wall, _ in samples]),
                  steady_gpu_ms=summary([gpu for _, gpu in samples]) if cuda else None,
                  steady_samples_ms=[[round(v, 4) if v is not None else None for v in s] for s in samples],
                  final_loss=float(losses[0].detach()))
    if cuda:
        result.update(peak_allocated_gib=torch.cuda.max_memory_allocated() / 2 ** 30,
                      peak_reserved_gib=torch.cuda.max_memory_reserved() / 2 ** 30)
    if mode.startswith("cache_"):
        result["stats"] = sys.modules["cudnn_cache"].stats()


def run_case(workload: str, mode: str, args) -> dict:
    """The case's result; one that raises gives 'error' (and 'traceback') beside what it measured until then."""
    result = {"workload": workload, "mode": mode, "torch": torch.__version__}
    try:
        measure(workload, mode, args, result)
    except Exception as error:  # recorded: the run goes on
        result.update(error=f"{type(error).__name__}: {error}"[:2000], traceback=traceback.format_exc()[-3000:])
    return result

# --- The runner: one subprocess per case ------------------------------------------------------------------------


def modes_of(workload: str, modes) -> list:
    """The modes run for `workload`, in MODES order: those of --modes, else all but DEFAULT_SKIP's."""
    return [m for m in MODES if (m in modes if modes else m not in DEFAULT_SKIP.get(workload, ()))]


def case_command(workload: str, mode: str, args, cache_file) -> list:
    command = module_command("real_workloads", "--case", f"{workload}:{mode}", "--device", args.device,
                             "--cache-file", cache_file)
    for name in ("steps", "warmup", "epoch_steps", "steady_epochs", "seed", "scale", "batch", "shapes"):
        if getattr(args, name) is not None:
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return command + (["--keep-jit-cache"] if args.keep_jit_cache else [])


def describe(result: dict) -> str:
    if "error" in result:
        return "FAILED: " + result["error"].splitlines()[0]
    gpu = (result.get("steady_gpu_ms") or {}).get("median", float("nan"))
    return (f"first step {result['first_step_s']:.2f} s, epochs {result['first_epoch_s']:.2f} / "
            f"{result['second_epoch_s']:.2f} s, steady {result['steady_wall_ms']['median']:.2f} ms wall, "
            f"{gpu:.2f} ms GPU ({result['process_s']:.0f} s in all)")


def run_all(args) -> dict:
    """Per workload, per round, its modes in MODES order, each in a fresh process; the results written after each."""
    report = {"benchmark": "real_workloads", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
              timespec="seconds"), "device": None, "torch": torch.__version__, "cudnn": None, "complete": False,
              "settings": {k: v for k, v in vars(args).items() if k not in ("case", "report", "cache_file")},
              "cases": [], "targets": []}
    rounds = range(args.first_round, args.first_round + args.rounds)
    plan = [(w, r, m) for w in args.workloads for r in rounds for m in modes_of(w, args.modes)]
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="real_workloads_") as folder:
        for index, (workload, round_, mode) in enumerate(plan, 1):
            kind = "nearest" if mode == "cache_nearest" else "cold"  # cache_warm loads its round's cold file
            cache_file = pathlib.Path(folder) / f"{workload}-{round_}-{kind}.cache"
            if mode in ("cache_cold", "cache_nearest"):
                cache_file.unlink(missing_ok=True)
            if args.budget is not None and time.perf_counter() - began > args.budget:
                result = {"error": f"skipped: the run passed --budget {args.budget:g} s"}
            elif mode == "cache_warm" and not cache_file.exists():
                result = {"error": "skipped: this round's cache_cold saved no cache file"}
            else:
                env = {k: v for k, v in os.environ.items() if k not in OWN_VARIABLES}
                env.update(case_environment(mode, cache_file, args.keep_jit_cache))
                result = run_subprocess(case_command(workload, mode, args, cache_file), args.timeout, env=env)
            result.update(workload=workload, mode=mode, round=round_)
            report["cases"].append(result)
            report["device"], report["cudnn"] = report["device"] or result.get("device"), report["cudnn"] or result.get("cudnn")
            print(f"[{index}/{len(plan)}] {workload}:{mode} round {round_}: {describe(result)}", flush=True)
            write(report, output_paths(NAME, args.output, args.update))
    report["complete"] = True
    return report


def write(report: dict, paths) -> None:
    """The JSON (whole or not at all) and its Markdown (.md beside it), with the targets computed again."""
    report["targets"] = targets(report["cases"])
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        part.write_text(json.dumps(report, indent=1) + "\n")
        part.replace(path)
        path.with_suffix(".md").write_text(markdown(report))

# --- Targets and the report --------------------------------------------------------------------------------------


def verdict(ratio, limit: float, noise: float = 0.0) -> str:
    if ratio is None:
        return "no data"
    return "met" if ratio <= limit else "within noise" if ratio <= limit + noise else "missed"


def field(case: dict, path: str):
    for key in path.split("."):
        case = case.get(key) if isinstance(case, dict) else None
    return case


def median(values: dict):
    return statistics.median(values.values()) if values else None


def targets(cases) -> list:
    """The target rows of every workload whose cases hold the modes of the target (the module's docstring)."""
    rows, wall, gpu = [], "steady_wall_ms.median", "steady_gpu_ms.median"
    for workload in dict.fromkeys(c["workload"] for c in cases):
        present = {c["mode"] for c in cases if c["workload"] == workload}

        def by(mode, path):  # round -> the field's value, over this workload's cases in `mode` that did not fail
            found = ((c["round"], field(c, path)) for c in cases
                     if (c["workload"], c["mode"]) == (workload, mode) and "error" not in c)
            return {r: value for r, value in found if value is not None}

        def row(target, value, native, native_mode, limit, noise=0.0, ratio=None, **extra):
            # Against native's cases of the same rounds where there are any: a machine drifts between rounds.
            native = {r: v for r, v in (native or {}).items() if r in value} or native
            value, native = median(value), median(native)
            ratio = ratio or (value / native if value is not None and native else None)
            rows.append({"target": target, "workload": workload, "value": value, "native": native,
                         "native_mode": native_mode, "ratio": ratio, "limit": limit,
                         "verdict": verdict(ratio, limit, noise), **extra})

        if {"cache_nearest", "native_heuristics"} <= present:
            hi, mid = by("native_heuristics", "steady_gpu_ms.hi"), by("native_heuristics", gpu)
            spread = median({r: hi[r] / mid[r] - 1 for r in mid if r in hi and mid[r]})
            row("1 nearest steady GPU ms <= 1.00x heuristics", by("cache_nearest", gpu), mid, "native_heuristics",
                1.0, noise=spread or 0.0, noise_allowed=spread)
            row("1 nearest first epoch s <= 1.05x heuristics", by("cache_nearest", "first_epoch_s"),
                by("native_heuristics", "first_epoch_s"), "native_heuristics", 1.05)
        if "cache_warm" in present and present & set(NATIVE):
            natives = {m: by(m, wall) for m in NATIVE if by(m, wall)}
            better, warm = min(natives, key=lambda m: median(natives[m]), default=None), by("cache_warm", wall)
            ratios = sorted(warm[r] / natives[better][r] for r in warm if better and r in natives[better])
            row("2 warm steady wall ms <= 1.00x better native", warm, natives.get(better), better, 1.0,
                ratio=statistics.median(ratios) if ratios else None, ratios=ratios)
        if not WORKLOADS[workload][2] and "cache_warm" in present:
            row("3 warm first epoch s <= 2x its second", by("cache_warm", "first_epoch_s"),
                by("cache_warm", "second_epoch_s"), "cache_warm epoch 2", 2.0)
        if {"cache_cold", "native_heuristics"} <= present:
            row("4 cold peak reserved GiB <= 1.2x heuristics", by("cache_cold", "peak_reserved_gib"),
                by("native_heuristics", "peak_reserved_gib"), "native_heuristics", 1.2)
    return rows


def number(value, spec: str = ".2f") -> str:
    return "-" if value is None else f"{value:{spec}}"


def markdown(report: dict) -> str:
    lines = [f"# Real workloads: {report.get('device') or 'no GPU recorded'}, torch {report.get('torch')}, "
             f"cuDNN {report.get('cudnn')}, {report.get('date')}", ""]
    cases = report["cases"]
    for workload in dict.fromkeys(c["workload"] for c in cases):
        lines += [f"## {workload}: {WORKLOADS.get(workload, ('?',))[0]}", "",
                  "| mode | round | first step s | process start to first step end s | epoch 1 s | epoch 2 s | "
                  "steady wall ms [95%] | steady GPU ms [95%] | peak allocated / reserved GiB | "
                  "cache tunes, misses, lent, entries |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in sorted((c for c in cases if c["workload"] == workload),
                        key=lambda c: (MODES.index(c["mode"]) if c["mode"] in MODES else 9, c.get("round", 0))):
            if "error" in c:
                lines.append(f"| {c['mode']} | {c.get('round')} | error: {c['error'].splitlines()[0][:150]} |" + " |" * 7)
                continue
            figures = [f"{number(f['median'])} [{number(f['lo'])}, {number(f['hi'])}]" if f else "-"
                       for f in (c["steady_wall_ms"], c.get("steady_gpu_ms"))]
            stats = c.get("stats")
            cache = ", ".join(str(stats.get(k, "-")) for k in ("tunes", "misses", "lent", "entries")) if stats else "-"
            lines.append(f"| {c['mode']} | {c.get('round')} | {number(c['first_step_s'])} | "
                         f"{number(c['start_to_first_step_s'])} | {number(c['first_epoch_s'])} | "
                         f"{number(c['second_epoch_s'])} | {figures[0]} | {figures[1]} | "
                         f"{number(c.get('peak_allocated_gib'))} / {number(c.get('peak_reserved_gib'))} | {cache} |")
        lines.append("")
    lines += ["## Targets", "", "| target | workload | measured | native | ratio | verdict |", "|---|---|---|---|---|---|"]
    for t in report.get("targets") or targets(cases):
        ratio = number(t["ratio"], ".3f")
        if t.get("ratios"):
            ratio += f" (rounds: {len(t['ratios'])}, {t['ratios'][0]:.3f} to {t['ratios'][-1]:.3f})"
        if t.get("noise_allowed") is not None:
            ratio += f" (noise allowed: {t['noise_allowed']:.3f})"
        lines.append(f"| {t['target']} | {t['workload']} | {number(t['value'], '.3f')} | {number(t['native'], '.3f')} "
                     f"({t['native_mode']}) | {ratio} | {t['verdict']} |")
    return "\n".join(lines) + "\n"


def load_reports(paths) -> dict:
    """One report of the result files of a run made in parts (by workloads, modes or --first-round): their cases,
    a later file's case replacing an earlier one of the same workload, mode and round."""
    reports = [json.loads(pathlib.Path(path).read_text()) for path in paths]
    cases = {(c["workload"], c["mode"], c.get("round", 1)): c for report in reports for c in report["cases"]}
    merged = {**reports[0], "cases": list(cases.values()), "parts": [str(path) for path in paths]}
    merged["device"] = next((r["device"] for r in reports if r.get("device")), None)
    merged["cudnn"] = next((r["cudnn"] for r in reports if r.get("cudnn")), None)
    merged["targets"] = targets(merged["cases"])
    return merged

# --- Command line ------------------------------------------------------------------------------------------------


def names(choices, what: str):
    """An argparse type: comma-separated names, each one of `choices`; else an error naming it and them."""
    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in choices] or ([] if items else [text])
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, unknown))}; the {what}s are: "
                                             f"{', '.join(choices)}")
        return list(dict.fromkeys(items))
    return parse


def case_name(text: str) -> tuple:
    workload, _, mode = text.partition(":")
    return names(list(WORKLOADS), "workload")(workload)[0], names(MODES, "mode")(mode)[0]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--workloads", type=names(list(WORKLOADS), "workload"), default=list(DEFAULT_WORKLOADS),
        help=f"comma-separated, of {', '.join(WORKLOADS)} (default {','.join(DEFAULT_WORKLOADS)})")
    add("--modes", type=names(MODES, "mode"), help=f"comma-separated, of {', '.join(MODES)} (default: all, but "
                                                   "native_benchmark for detection)")
    add("--rounds", type=int, default=1, help="each workload's modes this many times in turn (default 1)")
    add("--first-round", type=int, default=1, help="the first round's number, for a run made in parts (default 1)")
    add("--output", help=f"the result file (default bench-results/{NAME}; a .md beside it)")
    add("--update", action="store_true", help=f"also write benchmarks/results/{NAME} (committed)")
    add("--timeout", type=float, default=240.0, help="seconds per case's process (default 240)")
    add("--budget", type=float, help="seconds: start no case once the run has taken this long (default: no limit)")
    add("--report", nargs="+", metavar="JSON", help="run nothing: the tables and targets of result files (of a "
                                                    "run in parts: one report); with --output or --update, written")
    add("--keep-jit-cache", action="store_true", help="leave the driver's JIT cache on (CUDA_CACHE_DISABLE unset)")
    add("--steps", type=int, default=20, help="steady steps timed, fixed shapes (default 20)")
    add("--warmup", type=int, default=5, help="steps before those (default 5)")
    add("--epoch-steps", type=int, default=10, help="steps per epoch, fixed shapes (default 10)")
    add("--steady-epochs", type=int, default=6, help="steady epochs timed, changing shapes (default 6)")
    add("--batch", type=int, help="batch size of every workload run (default: each its own)")
    add("--shapes", type=int, help="sizes per epoch: detection 1-8 (default 4), speech (default 8)")
    add("--scale", type=float, default=1.0, help="multiplies image sizes and clip lengths (default 1)")
    add("--seed", type=int, default=0)
    add("--case", type=case_name, metavar="WORKLOAD:MODE", help="run one case in this process, print its JSON")
    add("--cache-file", help="a cache mode's CUDNN_CACHE_PATH, unless that is set (with --case)")
    add("--device", default="cuda", choices=("cuda", "cpu"), help=argparse.SUPPRESS)  # cpu: the tests' plumbing
    args = parser.parse_args(argv)
    if min(args.rounds, args.first_round, args.steps, args.epoch_steps, args.steady_epochs) < 1 or args.warmup < 0 or args.scale <= 0 \
            or (args.batch is not None and args.batch < 1):
        parser.error("--rounds, --first-round, --steps, --epoch-steps, --steady-epochs and --batch must be >= 1, --warmup >= 0, "
                     "--scale > 0")
    detecting = "detection" in ([args.case[0]] if args.case else args.workloads)
    if args.shapes is not None and (args.shapes < 1 or detecting and args.shapes > len(DETECTION_SIZES)):
        parser.error(f"--shapes {args.shapes}: >= 1, and at most {len(DETECTION_SIZES)} for detection")
    if args.modes and "cache_warm" in args.modes and "cache_cold" not in args.modes:
        parser.error("--modes: cache_warm loads the file its round's cache_cold saves; add cache_cold")
    if args.case and args.case[1].startswith("cache_") and not (args.cache_file or os.environ.get("CUDNN_CACHE_PATH")):
        parser.error(f"--case {':'.join(args.case)}: a cache mode needs --cache-file (or CUDNN_CACHE_PATH)")
    return args


def no_gpu(device: str) -> bool:
    """Says so on stderr where CUDA is asked for and there is none."""
    missing = device == "cuda" and not torch.cuda.is_available()
    if missing:
        print("real_workloads: no CUDA GPU is visible (torch.cuda.is_available() is False); this benchmark times "
              "cuDNN and needs one. Nothing was run.", file=sys.stderr)
    return missing


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        report = load_reports(args.report)
        if args.output or args.update:
            write(report, output_paths(NAME, args.output, args.update))
        print(markdown(report))
        return 0
    if args.case:
        workload, mode = args.case
        for name, value in case_environment(mode, args.cache_file, args.keep_jit_cache).items():
            os.environ.setdefault(name, value)  # before CUDA starts; what the runner set wins
        if no_gpu(args.device):
            return 2
        result = run_case(workload, mode, args)
        print(json.dumps(result), flush=True)
        return 1 if "error" in result else 0
    if no_gpu(args.device):
        return 2
    report = run_all(args)
    paths = output_paths(NAME, args.output, args.update)
    write(report, paths)
    print("\n" + markdown(report))
    print(f"real_workloads: wrote {', '.join(map(str, paths))} and the .md beside each")
    return 1 if any("error" in c for c in report["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
