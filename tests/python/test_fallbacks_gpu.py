"""Cache files edited to hold entries that fail on this GPU (issue 6, item 4), for both backends:

- an entry cuDNN refuses (NOT_SUPPORTED);
- an entry whose workspace cannot be allocated (out of memory);
- entries filed under another device identity;
- entries filed under another cuDNN version.

A fresh process loads the edited file and trains a convolution with it, twice. Every case must give native
forward and gradients, count its fallbacks in stats(), warn exactly once, and exit normally. Every test is
marked gpu (skipped without CUDA)."""

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

ops = torch.ops.cudnn_cache

# cudnn_cache_tool's JSON names a section per backend and direction.
GRAPH_SECTIONS = ("graph_forward", "graph_backward_data", "graph_backward_filter")
LEGACY_SECTIONS = ("legacy_forward", "legacy_backward_data", "legacy_backward_filter")
# cuDNN 9's NOT_SUPPORTED and its sub-codes (CUDNN_STATUS_NOT_SUPPORTED_*): 3000-3999.
NOT_SUPPORTED = range(3000, 4000)
ITERATIONS = 2
# Memory left under the cap of the graph backend's out-of-memory case: room for one training step's new
# tensors (the clones of x and w, y and both gradients: 78 MiB in PyTorch's 2 MiB-rounded segments), none for
# a workspace of STARVED bytes. The graph API's plan, not the file, says how much workspace a config needs, so
# that case ranks first a config that needs more than the cap leaves.
HEADROOM = 96 << 20
STARVED = 128 << 20

CHILD = r"""
import json, sys, warnings
import torch
import torch.nn.functional as F
import cudnn_cache

backend, mode, path = sys.argv[1:4]
cap_workspace = mode == "oom"
torch.backends.cudnn.allow_tf32 = False
cudnn_cache.set_backend(backend)
generator = torch.Generator().manual_seed(0)
x = torch.randn(32, 64, 56, 56, generator=generator).cuda()
w = torch.randn(64, 64, 3, 3, generator=generator).cuda()
dy = torch.randn(32, 64, 56, 56, generator=generator).cuda()

def train(conv):
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = conv(xs, ws, padding=1)
    y.backward(dy)
    return [y.detach(), xs.grad, ws.grad]

if mode == "create":
    train(cudnn_cache.functional.conv2d)
    cudnn_cache.save(path)
    sys.exit(0)

# Compared on the host: under the out-of-memory case's cap, the GPU holds the step's tensors and nothing else.
expected = [t.cpu() for t in train(F.conv2d)]
cudnn_cache.load(path)
cudnn_cache.set_miss_policy("tune" if mode == "tune" else "error")
cudnn_cache.reset_stats()
torch.cuda.synchronize()
if cap_workspace:  # room for the step's tensors, none for a large workspace; nothing cached to take it from
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + int(sys.argv[4])) / total)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    worst = 0.0
    for _ in range(int(sys.argv[5])):
        for ours, native in zip(train(cudnn_cache.functional.conv2d), expected):
            worst = max(worst, ((ours.cpu() - native).abs().max() / native.abs().max()).item())
    torch.cuda.synchronize()
messages = [str(warning.message) for warning in caught if "cudnn_cache" in str(warning.message)]
print(json.dumps({"stats": cudnn_cache.stats(), "worst": worst, "warnings": messages}))
"""


def run_child(child_env, backend, mode, path):
    result = subprocess.run([sys.executable, "-c", CHILD, backend, mode, str(path), str(HEADROOM), str(ITERATIONS)],
                            env=child_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"the child process failed (rc={result.returncode}):\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def tuned_files(child_env, tmp_path_factory):
    """A cache file per backend, tuned for the child's convolution in every direction."""
    folder = tmp_path_factory.mktemp("tuned")
    files = {}
    for backend in ("graph", "legacy"):
        files[backend] = folder / f"{backend}.cache"
        run_child(child_env, backend, "create", files[backend])
    return files


def edited(tmp_path, source, edit):
    """A copy of the cache file at `source` with edit(document) applied to its JSON form."""
    document = json.loads(ops.file_export_json(str(source)))
    (section,) = document["sections"]
    edit(section)
    (tmp_path / "edited.json").write_text(json.dumps(document))
    path = tmp_path / "edited.cache"
    ops.file_import_json(str(tmp_path / "edited.json"), str(path))
    return path


def best(entry):
    """The candidate an entry runs first: the fastest that succeeded (a ranking is sorted so when loaded)."""
    succeeded = [candidate for candidate in entry["ranking"]["candidates"] if candidate.get("status", 0) == 0]
    return min(succeeded, key=lambda candidate: candidate["time_ms"])


def refuse_graph(section):
    for name in GRAPH_SECTIONS:
        for entry in section[name]:
            best(entry)["engine_id"] = 1 << 20  # no engine has this index
    return len(GRAPH_SECTIONS)


def refuse_legacy(section):
    """Gives each entry's best candidate an algorithm that cudnnFind reported NOT_SUPPORTED for its key (kept in
    the ranking as a failed candidate, which goes), such as the forward DIRECT algorithm cuDNN lists but never
    runs; returns how many entries it edited."""
    edited = 0
    for name in LEGACY_SECTIONS:
        for entry in section[name]:
            candidates = entry["ranking"]["candidates"]
            refused = [c for c in candidates if c["status"] in NOT_SUPPORTED]
            if not refused:
                continue
            first = best(entry)
            candidates.remove(refused[0])
            first["algorithm"] = refused[0]["algorithm"]
            edited += 1
    assert edited > 0, "cudnnFind reported no algorithm NOT_SUPPORTED for any key: nothing to edit in"
    return edited


def move_to_front(candidates, candidate, time_ms):
    """Moves `candidate` to the front of a file's ranking (which must stay in rank order) with time `time_ms`."""
    version = candidates[0].pop("cereal_class_version", None)  # cereal writes it with the first element only
    candidates.remove(candidate)
    candidate["time_ms"] = time_ms
    candidates.insert(0, candidate)
    if version is not None:
        candidate["cereal_class_version"] = version


def starve_graph(section):
    """Ranks first, in one direction, the config with the largest workspace (the plan decides how much), and its
    smallest-workspace config second; every other entry runs its smallest-workspace config first. Under the
    child's cap only the starved config then fails, once per call."""
    entries = [entry for name in GRAPH_SECTIONS for entry in section[name]]
    timed = {id(entry): [c for c in entry["ranking"]["candidates"] if c.get("status", 0) == 0] for entry in entries}
    smallest = {id(entry): min(timed[id(entry)], key=lambda candidate: candidate["workspace_bytes"])
                for entry in entries}
    starved, largest = max(((entry, candidate) for entry in entries for candidate in timed[id(entry)]),
                           key=lambda pair: pair[1]["workspace_bytes"])
    assert largest["workspace_bytes"] >= STARVED, (
        f"no timed engine config needs {STARVED} bytes of workspace (largest: {largest['workspace_bytes']}), so "
        "the memory cap cannot starve one; pick a larger convolution in CHILD")
    for entry in entries:
        fitting = smallest[id(entry)]
        assert fitting["workspace_bytes"] <= HEADROOM // 8, (entry, "has no config with a small workspace")
        move_to_front(entry["ranking"]["candidates"], fitting, 1e-6 if entry is starved else 0.0)
    move_to_front(starved["ranking"]["candidates"], largest, 0.0)
    return 1


def starve_legacy(section):
    for name in LEGACY_SECTIONS:
        for entry in section[name]:
            best(entry)["workspace_bytes"] = 1 << 50  # a petabyte: the allocator refuses it
    return len(LEGACY_SECTIONS)


def other_device(section):
    section["origin"]["device"]["multiprocessor_count"] += 1
    return len(GRAPH_SECTIONS)


def other_cudnn(section):
    section["origin"]["cudnn_minor"] += 1
    return len(GRAPH_SECTIONS)


# (backend, edit, child mode, fallbacks per iteration or in all, what the one warning says)
CASES = {
    "graph-not_supported": ("graph", refuse_graph, "error", "per call", "could not run"),
    "legacy-not_supported": ("legacy", refuse_legacy, "error", "per call", "NOT_SUPPORTED"),
    "graph-out_of_memory": ("graph", starve_graph, "oom", "per call", "out of memory"),
    "legacy-out_of_memory": ("legacy", starve_legacy, "error", "per call", "out of memory"),
    "graph-other_device": ("graph", other_device, "tune", "once", "the cache holds it only for"),
    "legacy-other_device": ("legacy", other_device, "tune", "once", "the cache holds it only for"),
    "graph-other_cudnn": ("graph", other_cudnn, "tune", "once", "the cache holds it only for"),
    "legacy-other_cudnn": ("legacy", other_cudnn, "tune", "once", "the cache holds it only for"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_edited_entry_that_fails_falls_back_correctly_counted_and_warned_once(child_env, tuned_files, tmp_path,
                                                                                 case):
    backend, edit, mode, counting, words = CASES[case]
    failing = {}
    path = edited(tmp_path, tuned_files[backend], lambda section: failing.setdefault("n", edit(section)))
    result = run_child(child_env, backend, mode, path)
    report = json.loads(result.stdout.splitlines()[-1])
    stats = report["stats"]
    print(case, json.dumps(report))  # shown with -s: the figures the reliability table quotes
    assert report["worst"] < 1e-3, report  # fp32 without TF32: every path computes the same convolution
    expected = failing["n"] * (ITERATIONS if counting == "per call" else 1)
    assert stats["fallbacks"] == expected, stats
    if mode == "tune":  # the other origin's entries are never used: each key is tuned here, once
        assert stats["hits"] == 3 * (ITERATIONS - 1) and stats["misses"] == stats["tunes"] == 3, stats
    else:
        assert stats["hits"] == 3 * ITERATIONS and stats["misses"] == 0 and stats["tunes"] == 0, stats
    printed = result.stderr.count("Counted in stats()['fallbacks']")
    assert len(report["warnings"]) + printed == 1, (report["warnings"], result.stderr)
    (message,) = report["warnings"] or [line for line in result.stderr.splitlines() if "Counted in stats" in line]
    assert words in message, message
