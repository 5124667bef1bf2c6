"""The model bench's workloads: a model and its input, built alike by every benchmark that times them (models,
host-cost)."""

import dataclasses
from typing import Dict

import torch


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model and its input (its label is performance_doc.LABELS'): `model` is a torchvision name, or
    'conv3d_stack' or 'seed' (build_model)."""
    model: str
    batch: int
    shape: tuple  # input shape without the batch
    dtype: str
    channels_last: bool = False
    depthwise: bool = False  # depthwise convolutions, where native heuristics itself compiles engines at run time


WORKLOADS: Dict[str, Workload] = {
    "resnet50_fp32": Workload("resnet50", 32, (3, 224, 224), "float32"),
    "resnet50_bf16_cl": Workload("resnet50", 64, (3, 224, 224), "bfloat16", channels_last=True),
    "resnet18_fp16_cl": Workload("resnet18", 64, (3, 224, 224), "float16", channels_last=True),
    "mobilenet_v2_bf16_cl": Workload("mobilenet_v2", 64, (3, 224, 224), "bfloat16", channels_last=True, depthwise=True),
    "conv3d_fp32": Workload("conv3d_stack", 2, (1, 64, 64, 64), "float32"),
    "seed": Workload("seed", 7, (3, 32, 32), "float32"),
    # Grouped 3x3 convolutions of group width 8 in fp32, where cuDNN's FFMA and TF32 wgrad engines are close
    # and a stored choice was once slower than native's (issue 16).
    "regnet_y_400mf_fp32": Workload("regnet_y_400mf", 64, (3, 224, 224), "float32"),
}
def build_model(workload: Workload) -> torch.nn.Module:
    from torch import nn

    if workload.model == "seed":
        return nn.Sequential(nn.Conv2d(3, 64, 3, padding="same"), nn.ReLU(), nn.Conv2d(64, 32, 3), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1))
    if workload.model == "conv3d_stack":  # six 3x3x3 convolutions with ReLU, then a 1x1x1 head to 1 channel
        layers, channels = [], workload.shape[0]
        for out in (16, 32, 64, 64, 32, 16):
            layers += [nn.Conv3d(channels, out, 3, padding=1), nn.ReLU()]
            channels = out
        return nn.Sequential(*layers, nn.Conv3d(channels, 1, 1))
    import torchvision

    return torchvision.models.get_model(workload.model, weights=None)


def model_and_input(workload: Workload, device: torch.device, cache, convert: bool = True) -> tuple:
    """The model (converted when `cache` is the cudnn_cache module and `convert`), its input, and its
    convolution count."""
    torch.manual_seed(0)
    model = build_model(workload)
    convolutions = sum(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    if cache is not None and convert:
        cache.convert(model)
    dtype = getattr(torch, workload.dtype)
    model = model.to(device=device, dtype=dtype).train()
    x = torch.rand(workload.batch, *workload.shape).to(device=device, dtype=dtype)
    if workload.channels_last:
        memory_format = torch.channels_last_3d if x.dim() == 5 else torch.channels_last
        model, x = model.to(memory_format=memory_format), x.contiguous(memory_format=memory_format)
    return model, x.requires_grad_(True), convolutions
