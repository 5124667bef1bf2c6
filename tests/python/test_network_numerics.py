"""Numerics against a float64 reference, natively and through cudnn_cache (both paths).

test_conformance.py compares cudnn_cache with native PyTorch within a tolerance. In float32 with TF32 on
(PyTorch's default for cuDNN) two engines may both be right and still differ by more than that, the more so in a
deep network's parameter gradients; what tells an engine that rounds differently from a less accurate one is a
common reference: each side's error against the same computation in float64 with cuDNN off, tensor by tensor,
under Note [fp64-referenced error].

test_networks_*: torchvision's ResNet-18, DenseNet-121 and MobileNetV2 and a DCGAN generator (transposed
convolutions), BatchNorm in train mode, float32 with TF32, contiguous and channels-last: the output, and every
parameter's gradient against native's worst parameter's, on the step that tunes (misses) and on the next (hits).
test_fp16_transposed_3d_*: the float16 OpInfo samples of conv_transpose3d with output_padding >= stride, which
PyTorch runs with its own kernels (not cuDNN's), and so does cudnn_cache.
"""

import copy
import math
import warnings
from typing import Dict, List, Optional

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cudnn_cache
from conftest import cache_calls, intercepting, through, uses_cache
from test_conformance import OPINFOS, describe, functional_of, in_layout  # imports op_db, unfreezes the flags

# Note [fp64-referenced error]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The error of a tensor t against its float64 reference r is max|t - r| / max|r|. The rule, per group of tensors:
# each tensor's error through cudnn_cache <= FACTOR x native's worst error in the group + FLOOR. A single op's
# output and each gradient are groups of one (per tensor); a network's output is one group and its parameters'
# gradients another: each parameter is held to native's worst parameter, the "worst case".
#
# Why not each parameter against native's same parameter: in a ReLU network a parameter's gradient error is
# dominated by kink flips (an activation within TF32's rounding of zero takes the other branch), a few discrete
# events; whether one lands where it matters is luck, so one TF32 engine may leave a parameter at 1e-7 and another
# at 5e-2. Emulated on the CPU (these networks, float32 convolutions with their operands rounded to TF32 by
# round-to-nearest or by truncation, against float64), per-parameter error ratios of those two legitimate roundings
# reached 13 to 1.4e5; the output's and the worst parameter's stayed within 1.5 and 2.2 (5 inputs each, at the
# sizes below); with smooth activations instead the per-parameter ratios fell to 1.6-5.5.
#
# FACTOR = 4: TF32 rounds each convolution's operands to 10 mantissa bits (unit roundoff 2^-11 ~ 4.9e-4), and
# float16 stores with the same unit roundoff: that rounding is the bulk of both sides' error, and engines that round
# so, whatever their reduction order (split-K, tiling) or transforms (Winograd), differ in it by a small factor
# (about 2 between truncating and round-to-nearest conversion alone; measured above). An engine that loses three
# more bits (bfloat16 operands, emulated) had 5-12x native's output error.
# FLOOR = 1e-6, about 8 float32 ulps (2^-23 ~ 1.2e-7) relative: a tensor native computes (nearly) exactly, such as
# a gradient no convolution touches, must not fail on a different order of float32 sums alone.
# ZERO = 1e-12: a gradient that is zero in exact arithmetic (in MobileNetV2, a BatchNorm's bias whose output
# reaches only 1x1 convolutions, each followed by a train-mode BatchNorm, which removes any per-channel constant)
# has a reference of float64 rounding, ~1e-17 of the largest tensor's: below ZERO x the largest tensor of the
# reference (far below what float32 resolves, 2^-24 ~ 6e-8), r counts as zero and the error is measured against
# that largest tensor, max|t - r| / largest, instead of dividing rounding noise by float64's rounding.
FACTOR = 4.0
FLOOR = 1e-6
ZERO = 1e-12


def errors(results: Dict[str, torch.Tensor], reference: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """Each tensor's error against the reference's of the same name (Note [fp64-referenced error])."""
    largest = max(expected.abs().max().item() for expected in reference.values())

    def error(tensor, expected):
        scale = expected.abs().max().item()
        scale = scale if scale >= ZERO * largest else largest
        return (tensor.double() - expected).abs().max().item() / (scale if scale > 0 else 1.0)

    return {name: error(tensor, reference[name]) for name, tensor in results.items()}


def beyond_rule(native: Dict[str, float], ours: Dict[str, float], groups: List[List[str]]) -> Optional[str]:
    """Why cudnn_cache's errors break Note [fp64-referenced error]'s rule against native's, worst first; or None."""
    problems = []
    for group in groups:
        worst = max(group, key=lambda name: native[name])
        bound = FACTOR * native[worst] + FLOOR
        over = sorted((name for name in group if not ours[name] <= bound),  # NaN breaks it too
                      key=lambda name: -math.inf if math.isnan(ours[name]) else -ours[name])
        if over:
            problems.append(f"{len(over)} of {len(group)} above {FACTOR:g} x native's worst ({worst}: "
                            f"{native[worst]:.3g}) + {FLOOR:g}, worst first: "
                            + ", ".join(f"{name} {ours[name]:.3g} (native {native[name]:.3g})" for name in over[:5]))
    return "; ".join(problems) or None


# --- Networks: float32 with TF32 ---------------------------------------------------------------------------------

def dcgan_generator() -> nn.Module:
    """DCGAN's generator (Radford et al. 2015), narrowed: a 16-channel 1 x 1 noise to a 3 x 32 x 32 image."""
    layers = []
    for cin, cout, stride, padding in [(16, 64, 1, 0), (64, 32, 2, 1), (32, 16, 2, 1)]:
        layers += [nn.ConvTranspose2d(cin, cout, 4, stride, padding, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    return nn.Sequential(*layers, nn.ConvTranspose2d(16, 3, 4, 2, 1), nn.Tanh())


# Input shapes. At 2 x 3 x 64 x 64 the last layers' maps are 2 x 2, so train-mode BatchNorm normalizes 8 values
# and TF32's errors saturate (emulated: MobileNetV2's output 5-8%, its gradients over 100%, and two roundings' output
# errors up to 3.3x apart on DenseNet-121); at these sizes the ratios of Note [fp64-referenced error] hold.
NETWORKS = {"resnet18": (4, 3, 128, 128), "densenet121": (4, 3, 96, 96), "mobilenet_v2": (4, 3, 128, 128),
            "dcgan_generator": (16, 16, 1, 1)}


def network(name: str) -> nn.Module:
    """The model, on the CPU in float32 with seeded parameters, in train mode."""
    torch.manual_seed(0)
    if name == "dcgan_generator":
        return dcgan_generator().train()
    torchvision = pytest.importorskip("torchvision", reason="torchvision is installed by scripts/install_deps.sh")
    # No dropout: its masks would differ between dtypes; BatchNorm's batch statistics are the same on every side.
    options = {"dropout": 0.0} if name == "mobilenet_v2" else {}
    return getattr(torchvision.models, name)(weights=None, num_classes=10, **options).train()


def network_step(model: nn.Module, x: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The output and every parameter's gradient, by name, of a fixed random projection of the output."""
    output = model(x)
    probe = torch.randn(output.shape, generator=torch.Generator().manual_seed(7)).to(output)  # exact in float64
    names, parameters = zip(*model.named_parameters())
    grads = torch.autograd.grad((output * probe).sum(), parameters)
    return {"output": output.detach(), **dict(zip(names, grads))}


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("name", NETWORKS)
@pytest.mark.parametrize("path", ["convert", "intercept"])
def test_networks_are_as_accurate_as_native_against_fp64(path, name, layout, cache_state, torch_flags):
    """The output's error through cudnn_cache is within FACTOR x native's, and every parameter gradient's within
    FACTOR x native's worst parameter's (Note [fp64-referenced error]). Default tuning, so that cudnn_cache runs
    the engines it picks in use: on misses (each key tuned in the step), then on hits (the stored choices, as
    every later training step runs them)."""
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default
    model = network(name)
    x = torch.randn(NETWORKS[name], generator=torch.Generator().manual_seed(1))
    memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format

    def run(dtype, cached, memory_format=memory_format):
        side = copy.deepcopy(model).to("cuda", dtype, memory_format=memory_format)
        if uses_cache(path, cached):
            cudnn_cache.convert(side)
        with through(path, cached):
            return network_step(side, x.to("cuda", dtype).contiguous(memory_format=memory_format))

    with intercepting(False), torch.backends.cudnn.flags(enabled=False):
        reference = run(torch.float64, False, torch.contiguous_format)
    native = errors(run(torch.float32, False), reference)
    groups = [["output"], [key for key in native if key != "output"]]  # parameters: against native's worst
    problems = []
    for step in ("misses", "hits"):
        calls, hits = cache_calls(), cudnn_cache.stats()["hits"]
        ours = errors(run(torch.float32, True), reference)
        assert cache_calls() > calls, f"{step}: {name} did not reach the cache"
        assert step == "misses" or cudnn_cache.stats()["hits"] > hits, f"{step}: no hit"
        problem = beyond_rule(native, ours, groups)
        if problem:
            problems.append(f"{step}: {problem}")
    assert not problems, f"{path} {name} {layout} (TF32): " + "\n".join(problems)


# --- float16 conv_transpose3d with output_padding >= stride (PyTorch's own kernels) -------------------------------

TRANSPOSE_3D = next(op for op in OPINFOS if op.name == "nn.functional.conv_transpose3d")


def triple(value):
    return (value,) * 3 if isinstance(value, int) else tuple(value)


def padded_beyond_stride(sample) -> bool:
    """Whether some output_padding is >= its stride (PyTorch allows it where it is < the dilation)."""
    return any(padding >= stride for padding, stride in
               zip(triple(sample.kwargs.get("output_padding", 0)), triple(sample.kwargs.get("stride", 1))))


def transposed_step(sample, dtype, conv, memory_format) -> Dict[str, torch.Tensor]:
    """The output and the gradients of input, weight and bias, from fresh leaves of the sample in dtype."""
    def leaf(tensor):
        if not isinstance(tensor, torch.Tensor):
            return tensor
        return in_layout(tensor.to(dtype), memory_format if tensor.dim() == 5 else None)

    input, *args = [leaf(t) for t in [sample.input, *sample.args]]
    output = conv(input, *args, **sample.kwargs)
    probe = torch.randn(output.shape, generator=torch.Generator().manual_seed(7)).half().to(output)
    named = [(name, t) for name, t in zip(["input", "weight", "bias"], [input, *args]) if isinstance(t, torch.Tensor)]
    grads = torch.autograd.grad(output, [t for _, t in named], probe)
    return {"output": output.detach(), **{f"grad {name}": g for (name, _), g in zip(named, grads)}}


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_fp16_transposed_3d_with_output_padding_beyond_stride_is_as_accurate_as_native(layout, cache_state,
                                                                                        torch_flags):
    """Establishes whether native differs from itself on these samples (two runs of the same inputs, fresh leaves,
    compared bitwise: a UserWarning names the tensors that differ), and asserts that on both paths cudnn_cache's
    results are as close to float64 as native's (Note [fp64-referenced error]; native's error is the larger of its
    two runs'). Where both hold, a difference between cudnn_cache and native here is PyTorch's own kernels'
    rounding or run-to-run variation, not a less accurate result."""
    memory_format = torch.channels_last_3d if layout == "channels_last" else None
    samples = [s for s in TRANSPOSE_3D.sample_inputs("cuda", torch.float16, requires_grad=True)
               if padded_beyond_stride(s)]
    assert samples, "no float16 sample with output_padding >= stride: PyTorch's test material changed"
    unstable, failures = [], []
    for sample in samples:
        with intercepting(False), torch.backends.cudnn.flags(enabled=False):
            reference = transposed_step(sample, torch.float64, F.conv_transpose3d, None)
        with intercepting(False):
            runs = [transposed_step(sample, torch.float16, F.conv_transpose3d, memory_format) for _ in range(2)]
        differing = [name for name in runs[0] if not torch.equal(runs[0][name], runs[1][name])]
        if differing:
            unstable.append(f"{describe(sample)}: {differing}")
        first, second = (errors(run, reference) for run in runs)
        native = {name: max(first[name], second[name]) for name in first}
        for path in ("convert", "intercept"):
            with through(path, True):
                ours = errors(transposed_step(sample, torch.float16, functional_of(TRANSPOSE_3D.name, uses_cache(
                    path, True)), memory_format), reference)
            problem = beyond_rule(native, ours, [[name] for name in ours])
            if problem:
                failures.append(f"{path} {describe(sample)}: {problem}")
    if unstable:
        warnings.warn(f"native conv_transpose3d (float16, {layout}) differs from itself, bitwise, on "
                      f"{len(unstable)} of {len(samples)} samples: " + "; ".join(unstable))
    assert not failures, f"{len(failures)} of {2 * len(samples)} runs ({layout}):\n" + "\n".join(failures)
