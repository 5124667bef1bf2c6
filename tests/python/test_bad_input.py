"""Bad input at every API, CPU side first: each case must raise an error that names the input and says what to
do, or give the native result; none may crash. docs/RELIABILITY.md lists every case with the test that covers
it (the ids below). Cases that need CUDA tensors are marked gpu and skip, saying why, without one."""

import os
import random
import re
import stat
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import cudnn_cache

ops = torch.ops.cudnn_cache

X, W = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
INT32_MAX = 2**31 - 1


def conv(x=X, w=W, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1):
    return ops.convolution(x, w, bias, list(stride), list(padding), list(dilation), groups)


def meta(*sizes):
    """A tensor of these sizes that takes no memory: enough for keys and shape checks."""
    return torch.empty(sizes, device="meta")


# --- Tensors: dtypes, shapes, channels, groups, ranks, devices (CPU and meta) -----------------------------------

def native_conv(x=X, w=W, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1):
    """What torch.nn.functional runs for conv's arguments."""
    functional = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}.get(w.dim())
    if functional is None:
        return torch.convolution(x, w, bias, list(stride), list(padding), list(dilation), False, [0], groups)
    return functional(x, w, bias, list(stride), list(padding), list(dilation), groups)


def transpose(x, w, stride=(1,), padding=(0,), output_padding=(0,)):
    return ops.convolution_transpose(x, w, None, list(stride), list(padding), list(output_padding), [1], 1)


def native_transpose(x, w, stride=(1,), padding=(0,), output_padding=(0,)):
    return F.conv_transpose2d(x, w, None, list(stride), list(padding), list(output_padding), 1, [1])


# Bad tensors and arguments of the public ops. The cache takes only calls PyTorch itself would run with cuDNN
# (Note [Which convolutions the cache runs]), so PyTorch's own checks come first: each case raises what
# torch.nn.functional raises for it, of the same type (its message names the input), and a call PyTorch accepts
# gives PyTorch's result. Each case is a function of the convolution to call.
NATIVE_CASES = [
    # Dtypes: PyTorch computes int64 and complex convolutions on the CPU, and refuses bool.
    pytest.param(lambda c: c(X.long(), W.long()), id="dtype_int64"),
    pytest.param(lambda c: c(X.to(torch.complex64), W.to(torch.complex64)), id="dtype_complex"),
    pytest.param(lambda c: c(X.bool(), W.bool()), id="dtype_bool"),
    pytest.param(lambda c: c(X.to(torch.uint8), W.to(torch.uint8)), id="dtype_uint8"),
    pytest.param(lambda c: c(X, W.double()), id="dtype_mismatch"),
    pytest.param(lambda c: c(X, W, bias=torch.randn(6, dtype=torch.float64)), id="bias_dtype"),
    pytest.param(lambda c: c(X, W, bias=torch.randn(6, 1)), id="bias_rank"),
    # Mismatched shapes, channels and groups.
    pytest.param(lambda c: c(X, torch.randn(6, 3, 3, 3)), id="channels"),
    pytest.param(lambda c: c(X, W, groups=2), id="groups_mismatch"),
    pytest.param(lambda c: c(X, torch.randn(5, 2, 3, 3), groups=2), id="groups_divisibility"),
    pytest.param(lambda c: c(groups=0), id="groups_zero"),
    pytest.param(lambda c: c(groups=-2), id="groups_negative"),
    pytest.param(lambda c: c(X, torch.randn(6, 4, 3)), id="weight_rank"),
    pytest.param(lambda c: c(torch.randn(4, 8), torch.randn(6, 4)), id="input_2d"),
    pytest.param(lambda c: c(torch.randn(1, 1, 2, 2, 2, 2), torch.randn(1, 1, 1, 1, 1, 1)), id="input_6d"),
    pytest.param(lambda c: c(X, torch.randn(6, 4, 9, 9)), id="kernel_too_large"),
    pytest.param(lambda c: c(stride=(1, 1, 1)), id="stride_count"),
    pytest.param(lambda c: c(stride=(0,)), id="stride_zero"),
    pytest.param(lambda c: c(padding=(-1,)), id="padding_negative"),
    pytest.param(lambda c: c(dilation=(0,)), id="dilation_zero"),
    # Empty tensors: no output channels is an error, no input channels a result.
    pytest.param(lambda c: c(X, torch.randn(0, 4, 3, 3)), id="no_output_channels"),
    pytest.param(lambda c: c(torch.randn(2, 0, 8, 8), torch.randn(6, 0, 3, 3)), id="no_input_channels"),
    pytest.param(lambda c: c(torch.randn(2, 4, 0, 8), W), id="empty_spatial"),
    # Devices: PyTorch computes with a meta weight, to a result of no values (so only its shape is compared).
    pytest.param(lambda c: c(X, meta(6, 4, 3, 3)).shape, id="mixed_devices"),
]

TRANSPOSED_CASES = [
    pytest.param(lambda c: c(X, torch.randn(3, 6, 3, 3)), id="transpose_channels"),
    pytest.param(lambda c: c(X, torch.randn(4, 6, 3, 3), stride=(2,), output_padding=(2,)),
                 id="transpose_output_padding"),
    pytest.param(lambda c: c(X, torch.randn(4, 6, 3, 3), padding=(5,)), id="transpose_empty_output"),
]


def outcome(call):
    """('raised', exception type) or ('ran', result)."""
    try:
        return "ran", call()
    except Exception as error:  # noqa: BLE001 - compared with native's outcome
        return "raised", error


def assert_same_outcome(ours, native):
    assert ours[0] == native[0], f"cudnn_cache {ours[0]} {ours[1]!r}, native {native[0]} {native[1]!r}"
    if ours[0] == "raised":
        assert isinstance(ours[1], type(native[1])), f"cudnn_cache raised {ours[1]!r}, native {native[1]!r}"
    elif isinstance(native[1], torch.Tensor):
        assert ours[1].shape == native[1].shape and ours[1].device == native[1].device
        torch.testing.assert_close(ours[1], native[1], rtol=1e-5, atol=1e-5)
    else:
        assert ours[1] == native[1]


@pytest.mark.parametrize("call", NATIVE_CASES)
def test_bad_tensors_raise_what_pytorch_raises(call):
    assert_same_outcome(outcome(lambda: call(conv)), outcome(lambda: call(native_conv)))


@pytest.mark.parametrize("call", TRANSPOSED_CASES)
def test_bad_transposed_arguments_raise_what_pytorch_raises(call):
    assert_same_outcome(outcome(lambda: call(transpose)), outcome(lambda: call(native_transpose)))


# The cached ops themselves (_convolution_forward and the backward ops) take batched, checked tensors of the
# cuDNN dtypes only; their errors name the input and the fix.
TENSOR_CASES = [
    pytest.param(lambda: ops._convolution_forward(X.long(), W.long(), [1], [0], [1], 1),
                 r"input has dtype Long.*Convert with \.to\(torch\.float32\)", id="forward_dtype_int64"),
    pytest.param(lambda: ops._convolution_forward(X, torch.randn(6, 3, 3, 3), [1], [0], [1], 1),
                 r"input has 4 channels.*check in_channels and groups", id="forward_channels"),
    pytest.param(lambda: ops._convolution_forward(X, torch.randn(5, 2, 3, 3), [1], [0], [1], 2),
                 r"weight's first dimension \(5\) must be divisible by groups \(2\)", id="forward_groups"),
    pytest.param(lambda: ops._convolution_forward(torch.randn(4, 8), torch.randn(6, 4), [1], [0], [1], 1),
                 r"weight must be 3-D, 4-D or 5-D", id="forward_2d"),
    pytest.param(lambda: ops._convolution_forward(X, W, [1, 1, 1], [0], [1], 1),
                 r"stride has 3 values but the input has 2 spatial dimensions; give 1 or 2 values",
                 id="forward_stride_count"),
    pytest.param(lambda: ops._convolution_forward(X, W, [1], [0], [0], 1), r"dilation must be >= 1",
                 id="forward_dilation_zero"),
    pytest.param(lambda: ops._convolution_forward(X, torch.randn(6, 4, 9, 9), [1], [0], [1], 1),
                 r"kernel \(9 wide with dilation\) is larger than the padded input \(8\).*use a smaller kernel",
                 id="forward_kernel_too_large"),
    pytest.param(lambda: cudnn_cache.fill(X, W, [1], [0], [1]), r"cudnn_cache.fill tunes on the GPU: pass CUDA "
                 r"tensors", id="fill_cpu"),
    pytest.param(lambda: cudnn_cache.conv_key("forward", X, torch.randn(4, 6, 3, 3), [2], [0], [1], transposed=True,
                                              output_padding=[2]),
                 r"output_padding \[2, 2\] is not smaller than stride \[2, 2\].*runs such a convolution with its own "
                 r"kernels", id="key_output_padding_over_stride"),
    # The backward ops take sizes, not tensors: a wrong size list used to index past the weight's sizes.
    pytest.param(lambda: ops._convolution_backward_input(torch.randn(2, 6, 6, 6), W, [2, 4, 8], [1], [0], [1], 1),
                 r"input_size has 3 values but grad_output has 4 dimensions", id="backward_input_size_rank"),
    pytest.param(lambda: ops._convolution_backward_input(torch.randn(2, 6, 6, 6), torch.randn(6), [2, 4, 8, 8], [1],
                                                         [0], [1], 1),
                 r"weight must be 3-D, 4-D or 5-D.*got sizes \[6\]", id="backward_input_weight_rank"),
    pytest.param(lambda: ops._convolution_backward_input(torch.randn(2, 6), torch.randn(6, 4), [2, 4], [1], [0], [1],
                                                         1),
                 r"weight must be 3-D, 4-D or 5-D.*got sizes \[6, 4\]", id="backward_input_2d"),
    pytest.param(lambda: ops._convolution_backward_weight(torch.randn(2, 6, 6, 6), X, [6, 4, -3, 3], [1], [0], [1], 1),
                 r"weight_size \[6, 4, -3, 3\] has a negative size", id="backward_weight_negative_size"),
    pytest.param(lambda: ops._convolution_backward_weight(torch.randn(2, 6, 6, 6), X, [6, 4], [1], [0], [1], 1),
                 r"weight_size has 2 values but grad_output has 4 dimensions", id="backward_weight_size_rank"),
    pytest.param(lambda: ops._convolution_backward_input(meta(2, 6, 6, 6), meta(6, 4, 3, 3), [2, 4], [1], [0], [1],
                                                         1),
                 r"input_size has 2 values", id="backward_meta_size_rank"),
]


@pytest.mark.parametrize("call, match", TENSOR_CASES)
def test_bad_tensors_raise_an_error_naming_the_input_and_the_fix(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


# A bad bias, through the public ops and the cached ops that add one (Note [Gradients of the cached ops]): the
# error names the op called, not one it runs, and the fix.
BIAS_LENGTH = (r"bias must be 1-D with one value per output channel \({0}\), got sizes \[{1}\]; "
               r"pass a bias of {0} values")
BIAS_DTYPE = r"bias must match input's device and dtype \(cpu, Float\), got cpu, Double; move it with \.to\(input\)"
BIAS_CASES = [
    pytest.param(lambda: conv(bias=torch.randn(5)), "^convolution: " + BIAS_LENGTH.format(6, 5),
                 id="convolution_bias_length"),
    pytest.param(lambda: conv(bias=torch.randn(6, dtype=torch.float64)), "^convolution: " + BIAS_DTYPE,
                 id="convolution_bias_dtype"),
    pytest.param(lambda: conv(bias=torch.randn(6, 1)), "^convolution: " + BIAS_LENGTH.format(6, "6, 1"),
                 id="convolution_bias_2d"),
    pytest.param(lambda: ops.convolution_transpose(torch.randn(2, 6, 6, 6), W, torch.randn(6), [1], [0], [0], [1], 1),
                 "^convolution_transpose: " + BIAS_LENGTH.format(4, 6), id="convolution_transpose_bias_length"),
    pytest.param(lambda: ops._convolution_forward(X, W, [1], [0], [1], 1, torch.randn(5)),
                 "^_convolution_forward: " + BIAS_LENGTH.format(6, 5), id="forward_bias_length"),
    pytest.param(lambda: ops._convolution_forward(X, W, [1], [0], [1], 1, torch.randn(6, dtype=torch.float64)),
                 "^_convolution_forward: " + BIAS_DTYPE, id="forward_bias_dtype"),
    pytest.param(lambda: ops._convolution_forward(X, W, [1], [0], [1], 1, bias=torch.randn(6, 1)),
                 "^_convolution_forward: " + BIAS_LENGTH.format(6, "6, 1"), id="forward_bias_2d"),
    pytest.param(lambda: ops._convolution_forward(meta(2, 4, 8, 8), meta(6, 4, 3, 3), [1], [0], [1], 1, meta(5)),
                 "^_convolution_forward: " + BIAS_LENGTH.format(6, 5), id="forward_meta_bias_length"),
    pytest.param(lambda: ops._convolution_backward_input(torch.randn(2, 6, 6, 6), W, [2, 4, 8, 8], [1], [0], [1], 1,
                                                         torch.randn(6)),
                 "^_convolution_backward_input: " + BIAS_LENGTH.format(4, 6), id="backward_input_bias_length"),
]


@pytest.mark.parametrize("call, match", BIAS_CASES)
def test_a_bad_bias_raises_an_error_naming_the_op_and_the_fix(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_an_empty_batch_gives_the_native_result_forward_and_backward(layout):
    memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(0, 4, 8, 8).contiguous(memory_format=memory_format).requires_grad_()
    w = torch.randn(6, 4, 3, 3).requires_grad_()
    b = torch.randn(6).requires_grad_()
    y = cudnn_cache.functional.conv2d(x, w, b, padding=1)
    expected = F.conv2d(x, w, b, padding=1)
    assert y.shape == expected.shape == (0, 6, 8, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.count_nonzero(w.grad) == 0 and torch.count_nonzero(b.grad) == 0  # no samples, no gradient


def test_an_empty_batch_transposed_gives_the_native_shape():
    x, w = torch.randn(0, 4, 5, 5), torch.randn(4, 3, 3, 3)
    assert cudnn_cache.functional.conv_transpose2d(x, w, stride=2).shape == F.conv_transpose2d(x, w, stride=2).shape


# --- Sizes beyond cuDNN's int32 limits (meta tensors: keys, and the shape checks of the meta kernels) ------------

@pytest.mark.parametrize("input_size, weight_size, transposed, match", [
    # The input and the output both have the size; whichever is checked first is named.
    pytest.param((1, 1, 2**31, 1), (1, 1, 1, 1), False, r"(input|output) sizes \[1, 1, 2147483648, 1\]: every size "
                 r"must be in \[1, 2\^31 - 1\]; split the tensor", id="dimension_over_int32"),
    pytest.param((2**16, 2**16, 1, 1), (1, 2**16, 1, 1), False, r"input spans more elements than cuDNN's 32-bit "
                 r"indexing allows; split the batch", id="input_elements_over_int32"),
    pytest.param((1, 1, 2**16, 2**16), (2, 1, 1, 1), False, r"(input|output) spans more elements than cuDNN's "
                 r"32-bit indexing allows; split the batch", id="output_elements_over_int32"),
    pytest.param((1, 4, 2**15, 2**15), (4, 4, 1, 1), True, r"spans more elements than cuDNN's 32-bit indexing "
                 r"allows; split the batch", id="transposed_output_over_int32"),
])
def test_sizes_beyond_int32_are_refused_by_the_key_naming_the_fix(input_size, weight_size, transposed, match):
    with pytest.raises(RuntimeError, match=match):
        cudnn_cache.conv_key("forward", meta(*input_size), meta(*weight_size), [1], [0], [1], transposed=transposed)


def test_sizes_beyond_int32_still_have_meta_shapes():
    """Shape inference (torch.compile) needs no cuDNN, so it accepts what cuDNN cannot run."""
    y = conv(meta(2**16, 2**16, 1, 1), meta(1, 2**16, 1, 1))
    assert y.shape == (2**16, 1, 1, 1) and y.device.type == "meta"


# --- The cache: queries, settings, prepare (CPU side) -----------------------------------------------------------

def forward_key():
    return cudnn_cache.conv_key("forward", X, W, [1], [0], [1])


@pytest.mark.parametrize("call, match", [
    pytest.param(lambda: cudnn_cache.query("forward", (1, 2, 3)), r"a key has 47 values, got 3; pass what conv_key "
                 r"returned", id="query_short_key"),
    pytest.param(lambda: cudnn_cache.query("forward", (7,) * 47), r"not a valid key \(.*\); pass what conv_key "
                 r"returned", id="query_garbage_key"),
    pytest.param(lambda: cudnn_cache.query("forward", (2**40,) * 47), r"not a valid key", id="query_huge_values"),
    pytest.param(lambda: cudnn_cache.query("backward_data", forward_key()), r"the key is a forward key but direction "
                 r"is 'backward_data'", id="query_direction_mismatch"),
    pytest.param(lambda: cudnn_cache.query("sideways", forward_key()), r"unknown direction 'sideways'; use "
                 r"'forward', 'backward_data' or 'backward_filter'", id="query_unknown_direction"),
    pytest.param(lambda: cudnn_cache.query("forward", forward_key(), backend="fast"), r"'fast'.*'graph'.*'legacy'",
                 id="query_unknown_backend"),
    pytest.param(lambda: cudnn_cache.set_miss_policy("bogus"), r"unknown miss policy 'bogus'", id="miss_policy"),
    pytest.param(lambda: cudnn_cache.set_backend("bogus"), r"'bogus'.*'graph'.*'legacy'", id="backend"),
    pytest.param(lambda: cudnn_cache.prepare(threads=-1), r"threads must be >= 0", id="prepare_threads"),
    pytest.param(lambda: cudnn_cache.set_plan_cache_limit(-5), r"limit must be a non-negative integer",
                 id="plan_cache_limit_negative"),
    pytest.param(lambda: cudnn_cache.set_workspace_limit(-1), r"set_workspace_limit: bytes must be a non-negative "
                 r"integer .* or None \(no limit\), got -1", id="workspace_limit_negative"),
])
def test_bad_cache_arguments_raise_an_error_naming_them(call, match, cache_state):
    with pytest.raises(RuntimeError, match=match):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU errors; the gpu tests below cover a GPU")
@pytest.mark.parametrize("call", [
    pytest.param(lambda: cudnn_cache.query("forward", forward_key()), id="query"),
    pytest.param(lambda: cudnn_cache.prepare(), id="prepare"),
    pytest.param(lambda: cudnn_cache.prepare(background=True), id="prepare_background"),
])
def test_gpu_only_calls_without_a_gpu_say_so(call):
    with pytest.raises(RuntimeError, match="no CUDA device"):
        call()


# --- Files: load and save ---------------------------------------------------------------------------------------

@pytest.fixture
def valid_file(tool, tmp_path):
    path = tmp_path / "valid.cache"
    assert tool("synth", path, "--entries", 20).returncode == 0
    return path


def put_u32(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + value.to_bytes(4, "little") + data[offset + 4:]


VERSION_OFFSET = 9  # after the endianness byte and the 8-byte magic

DAMAGE = {
    # name: (how to damage the valid bytes, the reason, the fix the message must give)
    "empty": (lambda data: b"", r"truncated: 0 bytes", r"restore it from a backup or run the warm start again"),
    "truncated_header": (lambda data: data[:20], r"truncated: 20 bytes, shorter than the 29-byte header",
                         r"run the warm start again"),
    "truncated_payload": (lambda data: data[:len(data) // 2], r"truncated: it has \d+ bytes but its header promises",
                          r"run the warm start again"),
    "wrong_magic": (lambda data: data[:3] + b"X" + data[4:], r"not a cudnn_cache file \(wrong magic\)",
                    r"check the path"),
    "text_file": (lambda data: b"# not a cache\n", r"wrong magic", r"check the path"),
    "wrong_checksum": (lambda data: data[:-1] + bytes([data[-1] ^ 1]), r"corrupt: checksum mismatch",
                       r"delete it and run the warm start again"),
    "flipped_payload_bit": (lambda data: data[:40] + bytes([data[40] ^ 4]) + data[41:], r"corrupt: checksum mismatch",
                            r"delete it"),
    "future_version": (lambda data: put_u32(data, VERSION_OFFSET, 99), r"written by a newer cudnn_cache \(file "
                       r"format 99; this build reads 1 to 6\)", r"upgrade cudnn_cache"),
    "version_0": (lambda data: put_u32(data, VERSION_OFFSET, 0), r"corrupt: file format version 0 does not exist",
                  r"corrupt"),
    "trailing_bytes": (lambda data: data + b"extra", r"corrupt: 5 unexpected bytes after the checksum",
                       r"delete it and run the warm start again"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_file_is_refused_by_load_validate_and_the_cli_naming_file_reason_and_fix(
        damage, valid_file, tmp_path, tool, child_env, cache_state):
    make, reason, fix = DAMAGE[damage]
    path = tmp_path / f"{damage}.cache"
    path.write_bytes(make(valid_file.read_bytes()))
    cudnn_cache.load(valid_file)
    before = cudnn_cache.size()
    with pytest.raises(RuntimeError, match=reason) as error:
        cudnn_cache.load(path)
    assert str(path) in str(error.value)
    assert re.search(fix, str(error.value)), str(error.value)
    assert cudnn_cache.size() == before  # all or nothing

    result = tool("validate", path)
    assert result.returncode == 3 and str(path) in result.stderr and len(result.stderr.splitlines()) == 1
    cli = subprocess.run([sys.executable, "-m", "cudnn_cache", "validate", str(path)], env=child_env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 3 and str(path) in cli.stderr, cli.stderr
    assert "Traceback" not in cli.stderr


@pytest.mark.parametrize("what, match", [
    ("missing", r"cannot read '.*missing.cache': No such file or directory"),
    ("directory", r"cannot read '.*': not a regular file"),
    ("fifo", r"cannot read '.*fifo': not a regular file"),  # refused at once, not waited on
    ("empty_path", r"cannot read '': No such file or directory"),
])
def test_load_of_something_that_is_not_a_file_names_it(what, match, tmp_path, cache_state):
    path = {"missing": tmp_path / "missing.cache", "directory": tmp_path, "fifo": tmp_path / "fifo",
            "empty_path": ""}[what]
    if what == "fifo":
        os.mkfifo(path)
    with pytest.raises(RuntimeError, match=match):
        cudnn_cache.load(path)


@pytest.mark.parametrize("function", ["load", "save"])
@pytest.mark.parametrize("argument", [None, 42, 1.5])
def test_load_and_save_refuse_arguments_that_are_not_paths(function, argument, cache_state):
    with pytest.raises(TypeError, match=r"expected str, bytes or os.PathLike object"):
        getattr(cudnn_cache, function)(argument)


@pytest.mark.parametrize("where, merge, match", [
    ("empty", True, r"cannot save to '': give a file name"),
    ("trailing_slash", True, r"cannot save to '.*/': give a file name"),
    # A save takes the lock "<file>.lock" first (merging or not), so a missing folder fails there.
    ("missing_folder", True, r"cannot save '.*no/such/cache': cannot open its lock file '.*no/such/cache\.lock': No "
                             r"such file or directory \(create its folder first\); the previous file, if any, is "
                             r"unchanged"),
    # Merging or not: merge=False cannot replace a folder either, so the message does not offer it.
    ("over_a_folder", True, r"cannot save to '.*taken': it is a directory; give the name of a cache file \(nothing "
                            r"was written\)$"),
    ("over_a_folder", False, r"cannot save to '.*taken': it is a directory; give the name of a cache file"),
])
def test_save_to_a_bad_path_names_it_and_leaves_nothing_behind(where, merge, match, tmp_path, valid_file,
                                                                cache_state):
    cudnn_cache.load(valid_file)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "inside").write_text("kept")
    path = {"empty": "", "trailing_slash": f"{tmp_path}/", "missing_folder": tmp_path / "no" / "such" / "cache",
            "over_a_folder": tmp_path / "taken"}[where]
    before = set(os.listdir(tmp_path))
    with pytest.raises(RuntimeError, match=match):
        cudnn_cache.save(path, merge=merge)
    # No temporary file left, and no lock file next to a folder.
    assert set(os.listdir(tmp_path)) == before
    assert (tmp_path / "taken" / "inside").read_text() == "kept"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_save_into_a_read_only_folder_names_it(tmp_path, valid_file, cache_state):
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        # The lock file "<file>.lock" is created first, so that is what the folder refuses.
        with pytest.raises(RuntimeError, match=r"cannot open its lock file '.*read_only/cache\.lock': Permission "
                                               r"denied \(save into a folder you can write to\); the previous file"):
            cudnn_cache.save(folder / "cache")
    finally:
        folder.chmod(stat.S_IRWXU)


# --- JSON import ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, match", [
    pytest.param("not json", r"is not a valid cudnn_cache JSON export", id="not_json"),
    pytest.param("{}", r"is not a valid cudnn_cache JSON export", id="empty_object"),
    pytest.param('{"format_version": 99, "cudnn_version": 1, "cuda_runtime_version": 1, "sections": []}',
                 r"format_version 99 \(this build reads 1 to 6\)", id="future_version"),
    pytest.param('{"format_version": 5, "cudnn_version": 1, "cuda_runtime_version": 1, "sections": [{}]}',
                 r"is not a valid cudnn_cache JSON export: at sections\[0\]: missing field 'origin'",
                 id="section_without_origin"),
    # These used to show RapidJSON's "internal assertion failure: IsObject()", or to be accepted.
    pytest.param('{"format_version": 5, "cudnn_version": 1, "cuda_runtime_version": 1, "sections": [5]}',
                 r"at sections\[0\]: a value must be an object or an array", id="section_of_the_wrong_type"),
    pytest.param('{"format_version": 5, "cudnn_version": 1, "cuda_runtime_version": 1, "sections": [], "note": 1}',
                 r"unknown field 'note'; remove it", id="unknown_field"),
])
def test_import_of_bad_json_exits_3_naming_the_file_and_writes_nothing(text, match, cli, tmp_path):
    source = tmp_path / "export.json"
    source.write_text(text)
    result = cli("import", source, "-o", tmp_path / "out.cache")
    assert_refused(result.returncode, result.stdout, result.stderr, 3, match)
    assert str(source) in result.stderr and "rapidjson" not in result.stderr
    assert not (tmp_path / "out.cache").exists()


def test_import_of_a_json_export_with_graph_entries_under_format_1_is_refused(cli, valid_file, tmp_path):
    """Format 1 files cannot hold graph-API entries: the import must say so rather than write what deserialize
    of such a file would refuse (found by the fuzzer)."""
    exported = cli("export", valid_file, "--json")
    assert exported.returncode == 0, exported.stderr
    assert '"graph_forward": [\n' in exported.stdout or '"graph_' in exported.stdout
    source = tmp_path / "v1.json"
    source.write_text(exported.stdout.replace('"format_version": 6', '"format_version": 1', 1))
    result = cli("import", source, "-o", tmp_path / "out.cache")
    assert result.returncode == 3 and "format_version 1 cannot hold graph-API entries" in result.stderr, result.stderr


# --- The command lines ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, code, match", [
    pytest.param([], 2, r"the following arguments are required|usage", id="no_command"),
    pytest.param(["bogus"], 2, r"invalid choice: 'bogus'", id="unknown_command"),
    pytest.param(["validate"], 2, r"the following arguments are required", id="validate_without_file"),
    pytest.param(["export", "x.cache"], 2, r"--json", id="export_without_json"),
    pytest.param(["merge", "a.cache"], 2, r"-o/--output", id="merge_without_output"),
    pytest.param(["validate", "missing.cache"], 3, r"missing.cache.*No such file", id="validate_missing"),
    pytest.param(["validate", "."], 3, r"not a regular file", id="validate_directory"),
    pytest.param(["merge", "missing.cache", "-o", "out.cache"], 3, r"missing.cache", id="merge_missing_input"),
])
def test_cli_bad_arguments_exit_2_or_3_with_a_message(args, code, match, cli):
    result = cli(*args)
    assert_refused(result.returncode, result.stdout, result.stderr, code, match)


def test_cli_merge_into_a_missing_folder_exits_3_naming_it(cli, valid_file, tmp_path):
    result = cli("merge", valid_file, "-o", tmp_path / "no" / "out.cache")
    assert result.returncode == 3 and "no/out.cache" in result.stderr and "unchanged" in result.stderr


@pytest.mark.parametrize("args, code, match", [
    pytest.param([], 2, r"the following arguments are required: COMMAND", id="no_command"),
    pytest.param(["frobnicate"], 2, r"invalid choice: 'frobnicate'", id="unknown_command"),
    pytest.param(["inspect", "a", "b"], 2, r"unrecognized arguments: b", id="inspect_two_files"),
    pytest.param(["synth", "x.cache", "--entries", "ten"], 2, r"--entries: takes an integer from 0 to 100000, not "
                 r"'ten'", id="synth_bad_count"),
    pytest.param(["synth", "x.cache", "--entries", "-1"], 2, r"--entries: takes an integer from 0 to 100000",
                 id="synth_negative_count"),
    # Used to be left to allocate until the kernel killed the process (rc 137, no message).
    pytest.param(["synth", "x.cache", "--entries", "99999999999999"], 2, r"from 0 to 100000, not '99999999999999'",
                 id="synth_too_many"),
    pytest.param(["synth", "x.cache"], 2, r"the following arguments are required: --entries",
                 id="synth_without_entries"),
    pytest.param(["synth", "no/such/x.cache", "--entries", "3"], 3, r"cannot save 'no/such/x.cache'.*unchanged",
                 id="synth_missing_folder"),
    pytest.param(["validate", "missing.cache"], 3, r"cannot read 'missing.cache'", id="validate_missing"),
])
def test_tool_bad_arguments_exit_2_or_3_with_a_message(args, code, match, build_dir, tmp_path):
    result = subprocess.run([str(build_dir / "cudnn_cache_tool"), *args], cwd=tmp_path, capture_output=True, text=True)
    assert_refused(result.returncode, result.stdout, result.stderr, code, match)


# --- Every command line and environment variable, with every kind of bad input ----------------------------------
#
# What each must do: exit non-zero with one line on stderr that says what was wrong, print nothing on stdout
# (nothing that claims success), and never show a traceback. The Python command line (python -m cudnn_cache, the
# `cudnn_cache` command) and the runner are driven in this process through their main(), as the interpreter would
# (SystemExit included); the tool and the environment variables, which act at start-up, in child processes.

def assert_refused(returncode, stdout, stderr, code=None, match=None):
    """Non-zero (or exactly `code`), nothing on stdout, one line on stderr (matching `match`), no traceback."""
    assert returncode != 0 and (code is None or returncode == code), (returncode, stderr)
    assert stdout == "", stdout
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert match is None or re.search(match, lines[0]), lines[0]


@pytest.fixture
def in_process(capsys):
    """Runs main(args) to its end as `python -m ...` would: (exit status, stdout, stderr), in this process."""
    def run(main, *args):
        capsys.readouterr()
        try:
            status = main([str(arg) for arg in args])
        except SystemExit as exit:  # usage errors (argparse), and bad environment variables (a message)
            status = exit.code if isinstance(exit.code, int) or exit.code is None else 1
            if isinstance(exit.code, str):
                print(exit.code, file=sys.stderr)
        return (status or 0, *capsys.readouterr())
    return run


BAD_INPUTS = ["missing", "directory", "empty", "truncated", "random", "fifo"]
BAD_OUTPUTS = ["directory", "fifo", "through_a_file", "missing_folder"]


@pytest.fixture
def bad(valid_file, tmp_path):
    """Paths of every kind of bad input and output file, by name, and a valid JSON export."""
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    data = valid_file.read_bytes()
    for name, content in (("empty", b""), ("truncated", data[:len(data) // 2]),
                          ("random", random.Random(19).randbytes(4096))):
        (tmp_path / f"{name}.cache").write_bytes(content)
    return {"missing": tmp_path / "missing.cache", "directory": tmp_path / "folder", "fifo": tmp_path / "fifo",
            "empty": tmp_path / "empty.cache", "truncated": tmp_path / "truncated.cache",
            "random": tmp_path / "random.cache", "through_a_file": valid_file / "out.cache",
            "missing_folder": tmp_path / "no" / "such" / "out.cache"}


@pytest.mark.parametrize("kind", BAD_INPUTS)
@pytest.mark.parametrize("command", ["inspect", "validate", "stats", "diff_first", "diff_second", "merge", "export",
                                     "import"])
def test_every_cli_command_refuses_every_bad_input_in_one_line(command, kind, bad, valid_file, tmp_path, in_process):
    from cudnn_cache import __main__ as cli_main

    path, output = bad[kind], tmp_path / "out.cache"
    args = {"diff_first": ["diff", path, valid_file], "diff_second": ["diff", valid_file, path],
            "merge": ["merge", valid_file, path, "-o", output], "export": ["export", path, "--json"],
            "import": ["import", path, "-o", output]}.get(command, [command, path])
    assert_refused(*in_process(cli_main.main, *args), code=3, match=re.escape(str(path)))
    assert not output.exists()


@pytest.mark.parametrize("kind", BAD_OUTPUTS)
@pytest.mark.parametrize("command", ["merge", "export", "import", "synth"])
def test_every_cli_command_refuses_every_bad_output_in_one_line(command, kind, bad, valid_file, tmp_path, in_process):
    from cudnn_cache import __main__ as cli_main

    source = tmp_path / "valid.json"
    source.write_text(ops.file_export_json(str(valid_file)))
    output = bad[kind]
    args = {"merge": ["merge", valid_file, "-o", output], "export": ["export", valid_file, "--json", "-o", output],
            "import": ["import", source, "-o", output], "synth": ["synth", output, "--entries", 3]}[command]
    assert_refused(*in_process(cli_main.main, *args), code=3, match=re.escape(str(output)))
    assert not os.path.isfile(output)


@pytest.mark.parametrize("kind", BAD_INPUTS)
@pytest.mark.parametrize("command", ["validate", "inspect", "stats"])
def test_every_tool_command_refuses_every_bad_input_in_one_line(command, kind, bad, tool):
    result = tool(command, bad[kind])
    assert_refused(result.returncode, result.stdout, result.stderr, code=3, match=re.escape(str(bad[kind])))


@pytest.mark.parametrize("kind", BAD_OUTPUTS)
def test_tool_synth_refuses_every_bad_output_in_one_line(kind, bad, tool):
    result = tool("synth", bad[kind], "--entries", 3)
    assert_refused(result.returncode, result.stdout, result.stderr, code=3, match=re.escape(str(bad[kind])))
    assert not os.path.isfile(bad[kind])


@pytest.mark.parametrize("args, match", [
    pytest.param([], r"required: COMMAND", id="nothing"),
    pytest.param(["bogus"], r"invalid choice: 'bogus'", id="unknown_command"),
    pytest.param(["inspect"], r"required: file", id="inspect_without_file"),
    pytest.param(["inspect", "a", "b"], r"unrecognized arguments: b", id="inspect_two_files"),
    pytest.param(["diff", "a"], r"required: second", id="diff_one_file"),
    pytest.param(["import", "a.json"], r"required: -o/--output", id="import_without_output"),
    pytest.param(["synth", "x.cache"], r"required: --entries", id="synth_without_entries"),
    pytest.param(["synth", "x.cache", "--entries", "many"], r"--entries: takes an integer from 0 to 100000",
                 id="synth_bad_count"),
    pytest.param(["synth", "x.cache", "--entries", "99999999999999"], r"not '99999999999999'", id="synth_too_many"),
    pytest.param(["synth", "x.cache", "--entries", "3", "--seed", "-1"], r"--seed: takes an integer",
                 id="synth_negative_seed"),
    pytest.param(["stats", "--frobnicate", "x"], r"unrecognized arguments: --frobnicate", id="unknown_option"),
    pytest.param(["remote", "stats", "http://cache-host:6379"], r"argument URL: remote store 'http://cache-host:6379': "
                 r"the scheme must be redis or rediss", id="remote_scheme"),
    pytest.param(["remote", "push", "x.cache", "redis://:pw@cache-host:port"], r"remote store 'redis://:\*\*\*@cache-host"
                 r":port'.*Port could not be cast", id="remote_port_password_hidden"),
    pytest.param(["remote", "prune", "redis://h"], r"one of the arguments --origin --other-versions is required",
                 id="remote_prune_nothing"),
    pytest.param(["remote", "pull", "redis://h", "-o", "x", "--origin", "12"], r"takes an origin tag of 16 hex "
                 r"digits", id="remote_origin_tag"),
    pytest.param(["remote", "stats", "redis://h", "--timeout", "0x"], r"takes a number of seconds", id="remote_timeout"),
])
def test_cli_usage_errors_are_one_line_pointing_at_help(args, match, in_process):
    from cudnn_cache import __main__ as cli_main

    assert_refused(*in_process(cli_main.main, *args), code=2, match=match + r".*\(see python -m cudnn_cache.*--help\)$")


@pytest.mark.parametrize("command", ["", "inspect", "validate", "stats", "diff", "merge", "export", "import", "synth",
                                     "run", "remote", "remote stats", "remote push", "remote pull", "remote prune"])
def test_every_cli_command_has_help(command, in_process):
    from cudnn_cache import __main__ as cli_main

    status, stdout, stderr = in_process(cli_main.main, *command.split(), "--help")
    assert (status, stderr) == (0, "") and stdout.startswith(f"usage: python -m cudnn_cache {command}".rstrip())


@pytest.mark.parametrize("front", ["python -m cudnn_cache.run", "python -m cudnn_cache run"])
@pytest.mark.parametrize("args, code, match", [
    pytest.param([], 2, r"name a script to run", id="nothing"),
    pytest.param(["missing.py"], 2, r"no such script: missing.py", id="missing_script"),
    pytest.param(["{folder}"], 2, r"is not a file; name a Python script", id="directory_as_script"),
    pytest.param(["{fifo}"], 2, r"is not a file", id="fifo_as_script"),
    # Used to end in a runpy traceback.
    pytest.param(["-m", "no.such.module"], 2, r"cannot find module no.such.module: No module named 'no'",
                 id="missing_module"),
    pytest.param(["-m", "json"], 2, r"json is a package without a __main__ module", id="package_without_main"),
    pytest.param(["--frobnicate", "train.py"], 2, r"unrecognized arguments: --frobnicate", id="unknown_option"),
    pytest.param(["--cache", "", "train.py"], 2, r"--cache needs a file, a directory or 'default'", id="empty_cache"),
    pytest.param(["--remote", "http://x", "train.py"], 2, r"--remote: remote store 'http://x': the scheme must be redis",
                 id="remote_scheme"),
    pytest.param(["--cache", "{fifo}", "train.py"], 1, r"CUDNN_CACHE_PATH='.*fifo': .*fifo is not a regular file",
                 id="fifo_as_cache"),
    pytest.param(["--cache", "{through_a_file}", "train.py"], 1, r"valid.cache is not a directory",
                 id="cache_through_a_file"),
])
def test_runner_refuses_bad_arguments_in_one_line(front, args, code, match, bad, tmp_path, monkeypatch, in_process):
    from cudnn_cache import __main__ as cli_main
    from cudnn_cache import run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("raise SystemExit('the script ran')\n")
    for variable in ("CUDNN_CACHE_PATH", "CUDNN_CACHE_INTERCEPT"):  # restored whatever the runner sets
        monkeypatch.setenv(variable, "")
    paths = {"folder": bad["directory"], "fifo": bad["fifo"], "through_a_file": bad["through_a_file"]}
    args = [arg.format(**paths) for arg in args]
    main = run.main if front.endswith(".run") else (lambda argv: cli_main.main(["run", *argv]))
    assert_refused(*in_process(main, *args), code=code, match=match)
    assert cudnn_cache.active_file() is None


ENVIRONMENT_CASES = [
    # variable, value, command; the value's {placeholders} are paths of the `bad` fixture.
    pytest.param("CUDNN_CACHE_INTERCEPT", "bogus", "import", id="intercept_with_path"),
    pytest.param("CUDNN_CACHE_INTERCEPT", "bogus", "cli", id="intercept_under_the_cli"),
    pytest.param("CUDNN_CACHE_INTERCEPT", "bogus", "run", id="intercept_under_the_runner"),
    pytest.param("CUDNN_CACHE_LOG", "verbose", "import", id="log_level"),
    pytest.param("CUDNN_CACHE_PLAN_CACHE_LIMIT", "-1", "import", id="plan_cache_limit_negative"),
    pytest.param("CUDNN_CACHE_PLAN_CACHE_LIMIT", "ten", "cli", id="plan_cache_limit_a_word"),
    pytest.param("CUDNN_CACHE_PLAN_CACHE_LIMIT", "18446744073709551616", "import", id="plan_cache_limit_too_large"),
    pytest.param("CUDNN_CACHE_WORKSPACE_LIMIT", "64MB", "import", id="workspace_limit_with_a_unit"),
    pytest.param("CUDNN_CACHE_WORKSPACE_LIMIT", "-1", "cli", id="workspace_limit_negative"),
    pytest.param("CUDNN_CACHE_MISS_POLICY", "closest", "import", id="miss_policy_unknown"),
    pytest.param("CUDNN_CACHE_MISS_POLICY", "Nearest", "cli", id="miss_policy_capitalised"),
    pytest.param("CUDNN_CACHE_LIBRARY", "{missing}", "import", id="library_missing"),
    pytest.param("CUDNN_CACHE_LIBRARY", "{directory}", "cli", id="library_directory"),
    pytest.param("CUDNN_CACHE_LIBRARY", "{random}", "import", id="library_random_bytes"),
    pytest.param("CUDNN_CACHE_PATH", "{fifo}", "import", id="path_fifo"),
    pytest.param("CUDNN_CACHE_PATH", "{through_a_file}", "run", id="path_through_a_file"),
    pytest.param("CUDNN_CACHE_BUILD_DIR", "no-such-build", "cli", id="build_dir_missing"),
]


@pytest.mark.parametrize("variable, value, command", ENVIRONMENT_CASES)
def test_a_bad_environment_variable_ends_the_process_in_one_line(variable, value, command, bad, valid_file, tmp_path,
                                                                 child_env):
    """The variable, its value and what it takes, once: no traceback at import and none again from an exit
    handler, nothing loaded or written."""
    value = value.format(**bad)
    env = {key: item for key, item in child_env.items()
           if key not in ("CUDNN_CACHE_PATH", "CUDNN_CACHE_INTERCEPT", "CUDNN_CACHE_LOG")}
    if command != "run":  # the runner is given the file with --cache
        env["CUDNN_CACHE_PATH"] = str(tmp_path / "convs.cache")
    env[variable] = value
    script = tmp_path / "train.py"
    script.write_text("print('the script ran')\n")
    argv = {"import": ["-c", "import cudnn_cache; print('imported')"],
            "cli": ["-m", "cudnn_cache", "validate", str(valid_file)],
            "run": ["-m", "cudnn_cache.run", "--cache", str(tmp_path / "convs.cache"), str(script)]}[command]
    result = subprocess.run([sys.executable, *argv], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert_refused(result.returncode, result.stdout, result.stderr,
                   match=f"^cudnn_cache: {variable}={re.escape(repr(value))}: ")
    assert not (tmp_path / "convs.cache").exists()


# --- CUDA tensors (need a GPU: "GPU: pending run" in docs/RELIABILITY.md) ----------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("call", [
    pytest.param(lambda c: c(X.cuda(), W), id="cuda_input_cpu_weight"),
    pytest.param(lambda c: c(X.cuda(), W.cuda(), bias=torch.randn(6)), id="cuda_bias_on_cpu"),
    pytest.param(lambda c: c(X.cuda().long(), W.cuda().long()), id="cuda_dtype_int64"),
    pytest.param(lambda c: c(X.cuda(), W.cuda(), groups=2), id="cuda_groups"),
])
def test_bad_cuda_tensors_raise_what_pytorch_raises(call, cache_state):
    assert_same_outcome(outcome(lambda: call(conv)), outcome(lambda: call(native_conv)))


@pytest.mark.gpu
@pytest.mark.parametrize("call, match", [
    pytest.param(lambda: cudnn_cache.fill(X.cuda(), W, [1, 1], [0, 0], [1, 1]), r"move both to one device",
                 id="fill_mixed_devices"),
    pytest.param(lambda: cudnn_cache.prepare(device=99), r"device 99 does not exist", id="prepare_missing_device"),
    pytest.param(lambda: ops._convolution_backward_input(torch.randn(2, 6, 6, 6, device="cuda"), W.cuda(), [2, 4, 8],
                                                         [1], [0], [1], 1),
                 r"input_size has 3 values but grad_output has 4 dimensions", id="cuda_backward_input_size_rank"),
    pytest.param(lambda: ops._convolution_backward_input(torch.randn(2, 6, 5, 5, device="cuda"), W.cuda(),
                                                         [2, 4, 8, 8], [1], [0], [1], 1),
                 r"grad_output has sizes \[2, 6, 5, 5\] but the convolution", id="cuda_grad_output_size"),
])
def test_bad_cuda_tensors_raise_an_error_naming_the_input_and_the_fix(call, match, cache_state):
    with pytest.raises(RuntimeError, match=match):
        call()


@pytest.mark.gpu
def test_cuda_empty_batch_gives_the_native_result_forward_and_backward(cache_state):
    x = torch.randn(0, 4, 8, 8, device="cuda", requires_grad=True)
    w = torch.randn(6, 4, 3, 3, device="cuda", requires_grad=True)
    y = cudnn_cache.functional.conv2d(x, w, padding=1)
    assert y.shape == F.conv2d(x, w, padding=1).shape == (0, 6, 8, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape and torch.count_nonzero(w.grad) == 0
    assert cudnn_cache.fill(x.detach(), w.detach(), [1], [1], [1]) == 0  # nothing to tune


@pytest.mark.gpu
def test_cuda_sizes_beyond_int32_run_as_pytorch_runs_them(cache_state):
    """PyTorch splits the batch of such a call for cuDNN; the cache, whose keys hold cuDNN's 32-bit descriptors
    whole, hands it to PyTorch (Note [Which convolutions the cache runs])."""
    x = torch.ones(2**15 + 1, 1, 256, 256, device="cuda", dtype=torch.float16)  # 2^31 + 2^16 elements, 4 GiB
    w = torch.randn(1, 1, 1, 1, device="cuda", dtype=torch.float16)
    assert torch.equal(conv(x, w), F.conv2d(x, w))
    assert cudnn_cache.stats()["misses"] == cudnn_cache.stats()["hits"] == 0


@pytest.mark.gpu
def test_cuda_non_contiguous_and_misaligned_inputs_give_the_native_result(cache_state):
    base = torch.randn(2, 4, 9, 9, device="cuda")
    x = base[:, :, 1:, 1:]  # a view that starts inside the allocation, not 32-byte aligned
    torch.testing.assert_close(conv(x, W.cuda(), padding=(1,)), F.conv2d(x, W.cuda(), padding=1), rtol=1e-3,
                               atol=1e-3)


def test_conv_key_of_a_transposed_convolution_needs_no_output_padding():
    """output_padding is optional in conv_key and fill; it used to reach the op as [] and fail for transposed=True."""
    x, w = torch.randn(2, 4, 5, 5), torch.randn(4, 3, 3, 3)
    assert cudnn_cache.conv_key("backward_data", x, w, [2], [0], [1], transposed=True) == cudnn_cache.conv_key(
        "backward_data", x, w, [2], [0], [1], transposed=True, output_padding=[0, 0])
