"""PyTorch's cuDNN attention through the cache's plans (Note [Persisted attention plans]) against native: every
output of aten::_scaled_dot_product_cudnn_attention and the gradients, over dtypes, layouts, masks, causal and
dropout; the calls the cache hands back; and a second process that restores every plan instead of compiling it."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import cudnn_cache
from conftest import zero_code_runs

pytestmark = pytest.mark.gpu


@pytest.fixture
def attention_state(cache_state, torch_flags):
    before = cudnn_cache.intercepting()
    yield
    cudnn_cache.intercept(before)


def operands(b, h, s_q, s_kv, d, dtype, layout, seed=0):
    """q, k, v as a model makes them: (b, h, s, d) views of (b, s, h, d) projections ("bshd"), or contiguous."""
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def one(s):
        if layout == "bshd":
            t = torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=generator).transpose(1, 2)
        else:
            t = torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=generator)
        return t.requires_grad_()

    return one(s_q), one(s_kv), one(s_kv)


def mask_of(kind, b, h, s_q, s_kv, dtype):
    if kind is None:
        return None
    generator = torch.Generator(device="cuda").manual_seed(7)
    shape = {"2d": (s_q, s_kv), "4d": (b, h, s_q, s_kv), "4d-broadcast": (b, 1, s_q, s_kv)}[kind]
    return torch.randn(shape, device="cuda", dtype=dtype, generator=generator)


def attend(intercept, q, k, v, mask=None, causal=False, dropout=0.0, seed=1):
    """Output and q, k, v gradients of cuDNN SDPA, with the generator state after it; the gradient of a random
    projection of the output, so that every element's gradient counts."""
    cudnn_cache.intercept(intercept)
    for t in (q, k, v):
        t.grad = None
    torch.manual_seed(seed)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout)
    state = torch.cuda.get_rng_state()
    weight = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=torch.Generator("cuda").manual_seed(3))
    (out * weight).sum().backward()
    torch.cuda.synchronize()
    return out.detach().clone(), [t.grad.clone() for t in (q, k, v)], state


def tolerance(dtype):
    return {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float16 else {"atol": 1.6e-2, "rtol": 1.6e-2}


CASES = [
    # (b, h, s_q, s_kv, d, dtype, layout, mask, causal)
    (2, 8, 128, 128, 64, torch.float16, "bshd", None, False),
    (2, 8, 128, 128, 64, torch.bfloat16, "bshd", None, False),
    (4, 12, 77, 77, 64, torch.bfloat16, "bshd", None, False),    # an odd length, wav2vec2's heads
    (4, 12, 77, 77, 64, torch.float16, "bhsd", None, True),
    (1, 4, 33, 250, 128, torch.bfloat16, "bhsd", None, False),   # cross-attention, head dim 128
    (2, 8, 96, 96, 64, torch.float16, "bshd", "2d", False),
    (2, 8, 96, 96, 64, torch.bfloat16, "bhsd", "4d", False),
    (2, 8, 64, 80, 64, torch.bfloat16, "bshd", "4d-broadcast", True),
]


@pytest.mark.parametrize("b,h,s_q,s_kv,d,dtype,layout,mask,causal", CASES)
def test_cached_attention_matches_native(attention_state, b, h, s_q, s_kv, d, dtype, layout, mask, causal):
    q, k, v = operands(b, h, s_q, s_kv, d, dtype, layout)
    bias = mask_of(mask, b, h, s_q, s_kv, dtype)
    native_out, native_grads, _ = attend(False, q, k, v, bias, causal)
    before = cudnn_cache.stats()
    out, grads, _ = attend(True, q, k, v, bias, causal)
    after = cudnn_cache.stats()
    # Both directions ran through the cache's plans (built here, or restored; a repeat of a key on this thread
    # finds its plan and counts nothing, so the first case of each key is what counts).
    assert (after["attention_plans_built"] + after["attention_plans_restored"]
            >= before["attention_plans_built"] + before["attention_plans_restored"])
    assert out.shape == native_out.shape and out.stride() == native_out.stride() and out.dtype == native_out.dtype
    torch.testing.assert_close(out, native_out, **tolerance(dtype))
    for grad, native in zip(grads, native_grads):
        assert grad.stride() == native.stride()
        torch.testing.assert_close(grad, native, **tolerance(dtype))


def test_every_output_of_the_op_has_native_shape_layout_and_type(attention_state):
    q, k, v = (t.detach() for t in operands(2, 4, 50, 50, 64, torch.bfloat16, "bshd"))
    results = {}
    for intercept in (False, True):
        cudnn_cache.intercept(intercept)
        torch.manual_seed(5)
        results[intercept] = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.1, False, False)
    for native, cached in zip(results[False], results[True]):
        if isinstance(native, torch.Tensor):
            assert isinstance(cached, torch.Tensor)
            assert (native.shape, native.stride(), native.dtype, native.device) == \
                   (cached.shape, cached.stride(), cached.dtype, cached.device)
        else:
            assert native == cached  # None for the undefined ones, the lengths as ints
    output, logsumexp, *_, seed, offset, _ = results[True]
    torch.testing.assert_close(logsumexp, results[False][1], atol=1e-3, rtol=1e-3)
    assert seed.item() == results[False][6].item() and offset.item() == results[False][7].item()


def test_dropout_draws_what_native_draws_and_advances_the_generator_alike(attention_state):
    q, k, v = operands(2, 8, 128, 128, 64, torch.bfloat16, "bshd")
    native_out, native_grads, native_state = attend(False, q, k, v, dropout=0.1, seed=11)
    out, grads, state = attend(True, q, k, v, dropout=0.1, seed=11)
    assert torch.equal(state, native_state)
    torch.testing.assert_close(out, native_out, **tolerance(torch.bfloat16))
    for grad, native in zip(grads, native_grads):
        torch.testing.assert_close(grad, native, **tolerance(torch.bfloat16))
    assert not torch.equal(out, attend(True, q, k, v, dropout=0.1, seed=12)[0])  # another seed, another mask


def test_calls_the_cache_does_not_take_run_natively(attention_state, torch_flags):
    q, k, v = operands(2, 4, 64, 64, 64, torch.float16, "bshd")
    native_out, native_grads, _ = attend(False, q, k, v)
    torch.use_deterministic_algorithms(True, warn_only=True)
    before = cudnn_cache.stats()
    out, grads, _ = attend(True, q, k, v)
    assert cudnn_cache.stats()["attention_plans_built"] == before["attention_plans_built"]
    torch.testing.assert_close(out, native_out, atol=0, rtol=0)  # PyTorch's own kernel: the same bits


PERSIST_SCRIPT = r"""
import json, time, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import cudnn_cache  # CUDNN_CACHE_PATH is set: loads the file (if any), intercepts, saves at exit

torch.manual_seed(0)
projection = torch.nn.Linear(64, 3 * 64, device="cuda", dtype=torch.bfloat16)
sums = []
start = time.perf_counter()
for length in (50, 99, 150):
    x = torch.randn(2, length, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.view(2, length, 4, 16).transpose(1, 2) for t in projection(x).chunk(3, dim=-1))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=length == 99)
    out.float().square().sum().backward()
    sums.append(out.float().sum().item())
torch.cuda.synchronize()
print(json.dumps({"stats": cudnn_cache.stats(), "seconds": time.perf_counter() - start, "sums": sums,
                  "grad": projection.weight.grad.float().norm().item()}))
"""


def test_a_second_process_restores_every_attention_plan_and_computes_the_same(child_env, tmp_path):
    reports = zero_code_runs(child_env, PERSIST_SCRIPT, tmp_path / "attention.cache")
    first, second = (report["stats"] for report in reports)
    print("attention: first process", reports[0]["seconds"], "s, second", reports[1]["seconds"], "s")
    assert first["attention_plans_built"] >= 6 and first["attention_plans_restored"] == 0
    assert second["attention_plans_built"] == 0 and second["attention_plans_restored"] == first["attention_plans_built"]
    assert second["attention_plan_rebuilds"] == 0
    assert reports[1]["sums"] == pytest.approx(reports[0]["sums"], rel=1e-3)
    assert reports[1]["grad"] == pytest.approx(reports[0]["grad"], rel=1e-2)
