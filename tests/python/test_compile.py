"""torch.compile and torch.library.opcheck: every tensor op has a fake (Meta) kernel and a registered autograd,
passes opcheck (schema, autograd registration, fake tensors, AOT dispatch with dynamic shapes), and a converted
model compiles to one graph (fullgraph=True: no break at any convolution) that matches eager, forward and
gradients. On the CPU here; the same on the GPU where there is one."""

import pytest
import torch
from torch import nn

import cudnn_cache

ops = torch.ops.cudnn_cache

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def opcheck_cases(device):
    """(op overload, arguments) for each tensor op, with tensors that require grad where autograd applies."""
    def t(*sizes, grad=False):
        return torch.randn(*sizes, device=device, dtype=torch.float64 if device == "cpu" else torch.float32,
                           requires_grad=grad)

    return [
        (ops.convolution.default, (t(2, 4, 8, 8, grad=True), t(8, 4, 3, 3, grad=True), t(8, grad=True), [1, 1],
                                   [1, 1], [1, 1], 1)),
        (ops.convolution.default, (t(2, 4, 9, grad=True), t(4, 2, 3, grad=True), None, [2], [0], [1], 2)),
        (ops.convolution_transpose.default, (t(2, 8, 5, 5, grad=True), t(8, 4, 3, 3, grad=True), None, [2, 2],
                                             [1, 1], [1, 1], [1, 1], 1)),
        (ops._convolution_backward_input.default, (t(2, 8, 8, 8), t(8, 4, 3, 3), [2, 4, 8, 8], [1, 1], [1, 1],
                                                   [1, 1], 1)),
        (ops._convolution_backward_weight.default, (t(2, 8, 8, 8), t(2, 4, 8, 8), [8, 4, 3, 3], [1, 1], [1, 1],
                                                    [1, 1], 1)),
        # Both gradients at once; with tensors that require grad, it is the two ops above under autograd.
        (ops._convolution_backward.default, (t(2, 8, 8, 8, grad=True), t(2, 4, 8, 8, grad=True),
                                             t(8, 4, 3, 3, grad=True), [1, 1], [1, 1], [1, 1], 1)),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(6), ids=["conv2d", "conv1d_groups", "transpose", "backward_input",
                                                "backward_weight", "backward"])
def test_opcheck_passes(device, case, cache_state):
    op, args = opcheck_cases(device)[case]
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


def converted_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, stride=2, groups=2),
                          nn.ConvTranspose2d(4, 2, 2, stride=2))
    return cudnn_cache.convert(model)


@pytest.mark.parametrize("device", DEVICES)
def test_a_compiled_converted_model_is_one_graph_and_matches_eager(device, cache_state, torch_flags):
    if device == "cuda":
        torch.backends.cudnn.allow_tf32 = False  # both sides exact enough to compare tightly
    model = converted_model().to(device)
    x = torch.randn(2, 3, 16, 16, device=device)

    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons
    targets = [str(node.target) for node in explanation.graphs[0].graph.nodes]
    assert sum("cudnn_cache.convolution" in target for target in targets) == 3, targets  # 2 conv + 1 transpose

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected = model(eager_x)
    expected.square().sum().backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    actual = compiled(compiled_x)
    actual.square().sum().backward()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_x.grad, eager_x.grad, rtol=1e-5, atol=1e-5)
    for parameter, grad in zip(model.parameters(), expected_grads):
        torch.testing.assert_close(parameter.grad, grad, rtol=1e-5, atol=1e-5)
