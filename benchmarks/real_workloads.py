"""Real training workloads, native PyTorch and cudnn_cache side by side, each case in a fresh process.

Workloads (models built with weights=None and seeded, synthetic data made before the first step):
    detection   Faster R-CNN R50-FPN, 5 classes, fp32, batch 2, 1-3 random boxes an image, SGD; the image size changes
                every step (480x640, 512x704, 544x736, 608x800, each kept by the transform): an epoch, one step a size
    speech      torchaudio wav2vec2_base (layer drop 0, for steadier steps), bf16 autocast, batch 4, SGD on the
                features' mean square; 8 clip lengths evenly in 1-4 s at 16 kHz: an epoch, one step a length
    gan         DCGAN (100-d noise -> 3x64x64), fp32, batch 64, a discriminator and a generator Adam update a step
    dense       DenseNet-121, bf16 autocast, channels_last, batch 32, 224x224, SGD
    grouped     ResNeXt-50 32x4d, as dense
Modes; the cache modes as a user runs them: CUDNN_CACHE_PATH set for the process, which imports cudnn_cache (the
import loads the file and routes PyTorch's convolutions through the cache; the exit saves the file):
    native_benchmark   cudnn.benchmark=True (for detection and dense only if --modes names it: see DEFAULT_SKIP)
    native_heuristics  cudnn.benchmark=False
    cache_cold         a new file, miss policy 'tune'     cache_nearest   another new file, CUDNN_CACHE_MISS_POLICY=nearest
    cache_warm         the file this round's cache_cold saved
Every case runs with CUDA_CACHE_DISABLE=1 (no driver JIT cache, as on a fresh machine) and reports: its first step
(from the loop's start, and from the process's); epochs 1 and 2; the steady step (fixed shapes: --steps after
--warmup; changing shapes: the mean step of 6 more epochs), wall and GPU (CUDA events around each step,
synchronized at its end), median and 95% interval (stats.summary: min-max under 6 values); peak GPU memory;
cudnn_cache.stats() in the cache modes. The events time the stream from the step's first work to its last, idle
gaps included: a step whose host lags behind its GPU reads about its wall time there.
Targets: (1) cache_nearest steady GPU <= 1.00x native_heuristics' ('within noise' up to 1 + the upper spread of
native's interval), its first epoch <= 1.05x; (2) cache_warm steady wall <= 1.00x the better native mode's (the
lower median), the median of per-round ratios; (3) changing shapes: cache_warm's first epoch <= 2x its second;
(4) cache_cold's peak reserved memory <= 1.2x native_heuristics'.

    python3 -m benchmarks real-workloads --timeout 150 --update
    python3 -m benchmarks real-workloads --workloads gan,grouped --modes native_heuristics,cache_cold,cache_warm --rounds 3
    python3 -m benchmarks real-workloads --combine bench-results/a.json bench-results/b.json   # parts, no run

Writes bench-results/real_workloads.json and its tables (.md beside it) after every case ("complete": false until
the end). Exit: 0 all ran, 1 some case failed (recorded, the run goes on), 2 bad arguments or no GPU.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

T0 = time.perf_counter()  # before torch is imported: start_to_first_step_s counts from here
import torch  # noqa: E402  (CUDA starts at the first CUDA call, after a case has set its environment)

from benchmarks import (add_arguments, case_command, combine, no_gpu, output_paths, parse, run_case,  # noqa: E402
                        run_plan, write_result)
from benchmarks.measure import in_turn  # noqa: E402
from benchmarks.report import interval, number, table  # noqa: E402
from benchmarks.stats import summary  # noqa: E402

NAME = "real_workloads.json"  # the result file, in bench-results/ (and benchmarks/results/ with --update)
WORKLOADS = {  # name -> (label, batch, fixed shape)
    "detection": ("Faster R-CNN R50-FPN fp32 bs2, 4 image sizes", 2, False),
    "speech": ("wav2vec2 base bf16 bs4, 8 lengths 1-4 s", 4, False),
    "gan": ("DCGAN 64x64 fp32 bs64", 64, True),
    "dense": ("DenseNet-121 bf16 channels_last bs32", 32, True),
    "grouped": ("ResNeXt-50 32x4d bf16 channels_last bs32", 32, True),
}
MODES = ("native_benchmark", "native_heuristics", "cache_cold", "cache_nearest", "cache_warm")  # ordered per round: round_order
NATIVE = MODES[:2]
# Left out unless --modes names them, to fit a run in minutes: benchmark mode times every convolution shape it
# meets (detection: 4 sizes of ~50 convolutions; DenseNet: ~65 distinct shapes), most slowly without a JIT cache.
DEFAULT_SKIP = {"detection": ("native_benchmark",), "dense": ("native_benchmark",)}
DETECTION_SIZES = ((480, 640), (512, 704), (544, 736), (608, 800))
SPEECH_LENGTHS, STEADY_EPOCHS = 8, 6
OWN_VARIABLES = ("CUDNN_CACHE_PATH", "CUDNN_CACHE_MISS_POLICY", "CUDNN_CACHE_INTERCEPT")  # the modes set them


def training_step(optimizer, loss_of):
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        optimizer.step()
        return loss
    return step


# The workloads: each returns an epoch's steps (one per shape; one for a fixed shape).
def detection(device, batch):
    from torchvision.models.detection import fasterrcnn_resnet50_fpn

    model = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=5).to(device).train()
    optimizer, generator = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9), torch.Generator()
    generator.manual_seed(0)
    steps = []
    for h, w in DETECTION_SIZES:
        images, targets = [], []
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


def speech(device, batch):
    try:
        import torchaudio
    except ImportError as error:
        raise RuntimeError(f"the speech workload needs torchaudio, which cannot be imported here ({error})") from None
    model = torchaudio.models.wav2vec2_base(encoder_layer_drop=0.0).to(device).train()
    optimizer, generator = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), torch.Generator()
    generator.manual_seed(0)
    steps = []
    for i in range(SPEECH_LENGTHS):
        waves = torch.randn(batch, int(16000 * (1 + 3 * i / (SPEECH_LENGTHS - 1))), generator=generator)

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


def gan(device, batch):
    from torch.nn.functional import binary_cross_entropy_with_logits as bce

    g, d = (model.to(device).train() for model in dcgan())
    opt_g, opt_d = (torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.5, 0.999)) for model in (g, d))
    real = torch.rand(batch, 3, 64, 64, generator=torch.Generator().manual_seed(0)).to(device) * 2 - 1
    ones, zeros = torch.ones(batch, 1, device=device), torch.zeros(batch, 1, device=device)

    def step():
        fake = g(torch.randn(batch, 100, 1, 1, device=device))
        training_step(opt_d, lambda: bce(d(real), ones) + bce(d(fake.detach()), zeros))()
        return training_step(opt_g, lambda: bce(d(fake), ones))()
    return [step]


def classifier(name: str):
    def build(device, batch):
        import torchvision
        from torch.nn.functional import cross_entropy

        model = getattr(torchvision.models, name)(weights=None).to(device).train().to(memory_format=torch.channels_last)
        generator = torch.Generator().manual_seed(0)
        x = torch.rand(batch, 3, 224, 224, generator=generator).to(device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), generator=generator).to(device)

        def loss_of():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                return cross_entropy(model(x), y)
        return [training_step(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), loss_of)]
    return build


BUILDERS = {"detection": detection, "speech": speech, "gan": gan, "dense": classifier("densenet121"),
            "grouped": classifier("resnext50_32x4d")}


def modes_of(workload: str, modes) -> list:
    """The modes run for `workload`, in MODES order: those of --modes, else all but DEFAULT_SKIP's."""
    return [m for m in MODES if (m in modes if modes else m not in DEFAULT_SKIP.get(workload, ()))]


def round_order(modes: list, round_: int) -> list:
    """The modes in round `round_`'s order (measure.in_turn), but cache_warm after the cache_cold whose file it
    loads: a drift of the machine over a round then lands on no mode in every round."""
    order = in_turn(modes, round_)
    if "cache_warm" in order and "cache_cold" in order:
        warm, cold = order.index("cache_warm"), order.index("cache_cold")
        if warm < cold:
            order[warm], order[cold] = order[cold], order[warm]
    return order


def case_environment(mode: str, cache_file) -> dict:
    """The variables a case's process runs with, as a user would set them."""
    env = {"CUDA_CACHE_DISABLE": "1"}
    if mode.startswith("cache_") and cache_file:
        env["CUDNN_CACHE_PATH"] = str(cache_file)
        if mode == "cache_nearest":
            env["CUDNN_CACHE_MISS_POLICY"] = "nearest"
    return env


def measure(workload: str, mode: str, args, result: dict) -> None:
    """One case, in its own process (--case WORKLOAD:MODE), its figures in `result`."""
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.backends.cudnn.benchmark = mode == "native_benchmark"
    result["torch"] = torch.__version__
    if mode.startswith("cache_"):  # the zero-code path: CUDNN_CACHE_PATH is set, the script imports the package
        began = time.perf_counter()
        import cudnn_cache
        result.update(import_s=time.perf_counter() - began, cache_file=cudnn_cache.active_file(),
                      loaded_entries=cudnn_cache.size(), miss_policy=cudnn_cache.miss_policy(),
                      intercepting=cudnn_cache.intercepting())
    result.update(cudnn_cache_imported="cudnn_cache" in sys.modules,
                  jit_cache_disabled=os.environ.get("CUDA_CACHE_DISABLE") == "1")
    began = time.perf_counter()
    torch.manual_seed(0)
    steps = BUILDERS[workload](device, args.batch or WORKLOADS[workload][1])
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
                   for times in (epoch(length)[1] for _ in range(STEADY_EPOCHS))]
    result.update(steady_wall_ms=summary([wall for wall, _ in samples]),
                  steady_gpu_ms=summary([gpu for _, gpu in samples]) if cuda else None,
                  steady_samples_ms=[[None if v is None else round(v, 4) for v in s] for s in samples],
                  final_loss=float(losses[0].detach()))
    if cuda:
        result.update(peak_allocated_gib=torch.cuda.max_memory_allocated() / 2 ** 30,
                      peak_reserved_gib=torch.cuda.max_memory_reserved() / 2 ** 30)
    if mode.startswith("cache_"):
        result["stats"] = sys.modules["cudnn_cache"].stats()


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


def markdown(report: dict) -> str:
    """Every case's figures, by workload, then the targets."""
    lines = [f"# Real workloads: {report.get('device') or 'no GPU recorded'}, torch {report.get('torch')}, "
             f"cuDNN {report.get('cudnn')}, {report.get('date')}"]
    for workload in dict.fromkeys(c["workload"] for c in report["cases"]):
        rows = []
        for c in sorted((c for c in report["cases"] if c["workload"] == workload),
                        key=lambda c: (MODES.index(c["mode"]) if c["mode"] in MODES else 9, c.get("round", 0))):
            if "error" in c:
                rows.append([c["mode"], c.get("round"), f"error: {c['error'].splitlines()[0][:150]}"] + [""] * 7)
                continue
            stats = c.get("stats")
            rows.append([c["mode"], c.get("round"), *(number(c[k]) for k in ("first_step_s", "start_to_first_step_s",
                                                                            "first_epoch_s", "second_epoch_s")),
                         interval(c["steady_wall_ms"]), interval(c.get("steady_gpu_ms")),
                         f"{number(c.get('peak_allocated_gib'))} / {number(c.get('peak_reserved_gib'))}",
                         ", ".join(str(stats.get(k, "-")) for k in ("tunes", "misses", "lent", "entries")) if stats else "-"])
        lines += ["", f"## {workload}: {WORKLOADS.get(workload, ('?',))[0]}", ""] + table(
            ["mode", "round", "first step s", "process start to first step end s", "epoch 1 s", "epoch 2 s",
             "steady wall ms [95%]", "steady GPU ms [95%]", "peak allocated / reserved GiB",
             "cache tunes, misses, lent, entries"], rows)
    rows = []
    for t in report.get("targets") or targets(report["cases"]):
        ratio = number(t["ratio"], ".3f")
        if t.get("ratios"):
            ratio += f" (rounds: {len(t['ratios'])}, {t['ratios'][0]:.3f} to {t['ratios'][-1]:.3f})"
        if t.get("noise_allowed") is not None:
            ratio += f" (noise allowed: {t['noise_allowed']:.3f})"
        rows.append([t["target"], t["workload"], number(t["value"], ".3f"),
                     f"{number(t['native'], '.3f')} ({t['native_mode']})", ratio, t["verdict"]])
    lines += ["", "## Targets", ""] + table(["target", "workload", "measured", "native", "ratio", "verdict"], rows)
    return "\n".join(lines) + "\n"


def write(report: dict, paths) -> None:
    """The JSON (whole or not at all) and its Markdown (.md beside it), with the targets computed again."""
    report["targets"] = targets(report["cases"])
    report["device"] = report.get("device") or next((c["device"] for c in report["cases"] if c.get("device")), None)
    report["cudnn"] = report.get("cudnn") or next((c["cudnn"] for c in report["cases"] if c.get("cudnn")), None)
    write_result(report, paths, markdown(report))


def describe(result: dict) -> str:
    gpu = (result.get("steady_gpu_ms") or {}).get("median", float("nan"))
    return (f"first step {result['first_step_s']:.2f} s, epochs {result['first_epoch_s']:.2f} / "
            f"{result['second_epoch_s']:.2f} s, steady {result['steady_wall_ms']['median']:.2f} ms wall, "
            f"{gpu:.2f} ms GPU ({result['process_s']:.0f} s in all)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, NAME, workloads=list(WORKLOADS), modes=MODES, timeout=240.0, rounds=True)
    add = parser.add_argument
    add("--first-round", type=int, default=1, help="the first round's number, for a run made in parts (default 1)")
    add("--steps", type=int, default=20, help="steady steps timed, fixed shapes (default 20)")
    add("--warmup", type=int, default=5, help="steps before those (default 5)")
    add("--epoch-steps", type=int, default=10, help="steps per epoch, fixed shapes (default 10)")
    add("--batch", type=int, help="batch size of every workload run (default: each its own)")
    args = parse(parser, argv, list(WORKLOADS), MODES)
    if min(args.first_round, args.steps, args.epoch_steps, args.batch or 1) < 1 or args.warmup < 0:
        parser.error("--first-round, --steps, --epoch-steps and --batch must be >= 1, --warmup >= 0")
    if args.modes and "cache_warm" in args.modes and "cache_cold" not in args.modes:
        parser.error("--modes: cache_warm loads the file its round's cache_cold saves; add cache_cold")
    args.workloads = args.workloads or ["detection", "speech", "gan", "dense", "grouped"]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    paths = output_paths(NAME, args.output, args.update)
    if args.combine:
        report = combine(args.combine)
        if args.output or args.update:
            write(report, paths)
        print(markdown(dict(report, targets=targets(report["cases"]))))
        return 0
    if args.case:
        workload, mode = args.case.split(":")
        for name, value in case_environment(mode, args.cache_file).items():
            os.environ.setdefault(name, value)  # before CUDA starts; what the runner set wins
        if no_gpu(args.device, "real_workloads"):
            return 2
        return run_case(lambda result: measure(workload, mode, args, result), {"workload": workload, "mode": mode})
    if no_gpu(args.device, "real_workloads"):
        return 2
    report = {"benchmark": "real_workloads", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
              timespec="seconds"), "device": None, "torch": torch.__version__, "cudnn": None, "complete": False,
              "settings": {k: v for k, v in vars(args).items() if k not in ("case", "combine", "cache_file")},
              "cases": []}
    rounds = range(args.first_round, args.first_round + args.rounds)
    plan = [(w, m, r) for w in args.workloads for r in rounds for m in round_order(modes_of(w, args.modes), r)]

    def command(workload, mode, cache_file):
        env = {k: v for k, v in os.environ.items() if k not in OWN_VARIABLES}
        env.update(case_environment(mode, cache_file))
        return case_command("real_workloads", "--case", f"{workload}:{mode}", "--device", args.device, "--steps",
                            args.steps, "--warmup", args.warmup, "--epoch-steps", args.epoch_steps,
                            *(["--batch", args.batch] if args.batch else [])), env

    report["cases"] = run_plan(plan, {"cache_warm": "cache_cold"}, command, args, describe,
                               lambda cases: write(dict(report, cases=cases), paths))
    report["complete"] = True
    write(report, paths)
    print("\n" + markdown(report))
    print(f"real_workloads: wrote {', '.join(map(str, paths))} and the .md beside each")
    return 1 if any("error" in c for c in report["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
