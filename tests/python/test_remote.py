"""The remote store on Redis (cudnn_cache/remote.py, Note [Remote store]) against a real redis-server, started
by these tests on a free loopback port (scripts/install_deps.sh installs Debian's redis-server): round trips,
the server-side merge under concurrent writers, damaged and foreign entries, faults (down, killed mid-push,
restarted, slow, out of memory, wrong password) and other versions of the format."""

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch

import cudnn_cache
from cudnn_cache import remote

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
from benchmarks import remote as bench_remote  # noqa: E402
from redis_server import REDIS_SERVER, RedisServer, free_port  # noqa: E402

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed (scripts/install_deps.sh "
                                                             "installs Debian's)")
PASSWORD = "s3cret-pass"


@pytest.fixture
def server(tmp_path):
    folder = tmp_path / "redis"
    folder.mkdir()
    started = RedisServer(folder)
    yield started
    started.kill()


@pytest.fixture
def synth(cli, tmp_path):
    def make(name: str, entries: int, seed: int = 1) -> pathlib.Path:
        path = tmp_path / name
        assert cli("synth", path, "--entries", entries, "--seed", seed).returncode == 0
        return path
    return make


def same_cache(cli, first, second) -> bool:
    done = cli("diff", first, second)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- Round trips and the merge --------------------------------------------------------------------------------

def test_a_file_pushed_and_pulled_back_is_the_same_cache(cli, synth, server, tmp_path):
    source = synth("a.cache", 300)
    pushed = cli("remote", "push", source, server.url, "--json")
    assert pushed.returncode == 0, pushed.stderr
    report = json.loads(pushed.stdout)
    assert report["entries"] == report["stored"] == 300 and report["unchanged"] == 0
    again = json.loads(cli("remote", "push", source, server.url, "--json").stdout)
    assert again["stored"] == 0 and again["unchanged"] == 300  # no news: nothing written
    pulled = cli("remote", "pull", server.url, "-o", tmp_path / "back.cache")
    assert pulled.returncode == 0, pulled.stderr
    assert "300 entries of 1 origins, 0 left out" in pulled.stdout
    assert same_cache(cli, source, tmp_path / "back.cache")
    stats = cli("remote", "stats", server.url, "--json")
    held = json.loads(stats.stdout)
    assert held["format_version"] == cudnn_cache.FORMAT_VERSION and held["other_versions"] == {}
    ((tag, origin),) = held["origins"].items()
    assert origin["entries"] == 300 and "cudnn_cache synthetic GPU" in origin["origin"]
    cudnn = torch.backends.cudnn.version()
    assert tag == cudnn_cache._ops.origin_tag("cudnn_cache synthetic GPU", [9, 0, 132, cudnn // 10000,
                                                                          cudnn % 10000 // 100])


def test_over_tls_a_pushed_file_comes_back_and_an_unknown_ca_is_refused(cli, synth, tmp_path):
    source = synth("a.cache", 50)
    with RedisServer(tmp_path / "tls", tls=True) as secure:
        assert secure.url.startswith("rediss://") and "ssl_ca_certs=" in secure.url
        assert cli("remote", "push", source, secure.url).returncode == 0
        assert cli("remote", "pull", secure.url, "-o", tmp_path / "back.cache").returncode == 0
        assert same_cache(cli, source, tmp_path / "back.cache")
        untrusted = cli("remote", "stats", secure.url.split("?")[0])  # the server's CA is not the system's
        assert untrusted.returncode == 5 and "certificate verify failed" in untrusted.stderr, untrusted.stderr
        plain = cli("remote", "stats", secure.url.split("?")[0].replace("rediss://", "redis://"))
        assert plain.returncode == 5


def test_the_urls_database_holds_the_entries_and_others_stay_empty(synth, server):
    source = synth("a.cache", 12)
    numbered = server.url.rsplit("/", 1)[0] + "/3"
    assert remote.Remote(numbered).push(source.read_bytes(), str(source)).stored == 12
    assert remote.Remote(numbered).pull()[1].entries == 12
    assert remote.Remote(server.url).pull()[1].entries == 0  # database 0
    assert server.client().call("DBSIZE") == 0


def test_pushes_merge_on_the_server_as_the_merge_command_merges(cli, synth, server, tmp_path):
    first = synth("first.cache", 200, seed=3)
    # The same keys, half of them measured faster, half slower; and entries of another seed.
    second = bench_remote.scaled_copy(first, tmp_path / "second.cache",
                                      lambda i: 1.0 if i % 2 else (0.5 if i % 4 == 0 else 2.0))
    third = synth("third.cache", 50, seed=4)
    for path in (first, second, third):
        assert cli("remote", "push", path, server.url).returncode == 0
    assert cli("merge", first, second, third, "-o", tmp_path / "merged.cache").returncode == 0
    assert cli("remote", "pull", server.url, "-o", tmp_path / "pulled.cache").returncode == 0
    assert same_cache(cli, tmp_path / "merged.cache", tmp_path / "pulled.cache")
    assert not same_cache(cli, first, tmp_path / "pulled.cache")  # the merge changed something


def test_a_push_writes_the_entries_settle_changed_over_the_servers_and_merges_the_others(synth, server, tmp_path):
    # Note [A settled key replaces the file's]: the entries named as replacing (settle() changed them in the
    # saving process) take the server copy's place, which a merge by the faster time would keep.
    first = synth("first.cache", 20, seed=5)
    slower = bench_remote.scaled_copy(first, tmp_path / "slower.cache", lambda i: 2.0)  # the same keys, 2x the time
    store = remote.Remote(server.url)
    store.push(first.read_bytes(), str(first))
    fastest = {name: blob for name, _, blob in remote.split(first.read_bytes(), str(first))}
    entries = remote.split(slower.read_bytes(), str(slower))
    settled = {name for name, _, _ in entries[:5]}
    report = store.push(slower.read_bytes(), str(slower), replacing=settled)
    assert (report.entries, report.stored, report.unchanged) == (20, 5, 15)
    client = server.client()
    prefix = f"cudnn_cache:v{cudnn_cache.FORMAT_VERSION}:entry:"
    for name, _, blob in entries:
        assert client.call("GET", prefix + name) == (blob if name in settled else fastest[name]), name


def test_16_concurrent_writers_of_1000_entries_lose_nothing_and_keep_the_fastest(server, tmp_path):
    # Half the writers push entries of their own, half the same keys with other measurements, all at once; the
    # store must then hold what `cudnn_cache merge` of the 16 files holds.
    result = bench_remote.concurrent_writers(tmp_path, server.url)
    assert result["lost"] == result["extra"] == result["not_fastest"] == 0, result
    assert "9000 entries" in result["pulled_summary"]  # 8 x 1000 disjoint + the 1000 shared keys


def test_10000_entries_go_up_and_come_back_each_once(cli, synth, server, tmp_path):
    source = synth("big.cache", 10000)
    assert cli("remote", "push", source, server.url).returncode == 0
    data, report = remote.Remote(server.url).pull()  # its time: python3 -m benchmarks remote
    assert report.entries == 10000 and report.refused == [] and report.origins == 1
    cudnn_cache._ops.file_write_checkpoint(str(tmp_path / "back.cache"), remote._tensor(data))
    assert same_cache(cli, source, tmp_path / "back.cache")


# --- What comes back is checked -------------------------------------------------------------------------------

def test_damaged_and_misnamed_remote_entries_are_left_out_counted_and_replaced_by_a_push(cli, synth, server,
                                                                                      tmp_path):
    source = synth("a.cache", 40)
    assert cli("remote", "push", source, server.url).returncode == 0
    client = server.client()
    prefix = f"cudnn_cache:v{cudnn_cache.FORMAT_VERSION}:entry:"
    names = sorted(key.decode() for key in client.scan(prefix + "*"))
    assert len(names) == 40
    garbage, truncated, misnamed, other = names[0], names[1], names[2], names[3]
    client.call("SET", garbage, b"not a cache file")
    client.call("SET", truncated, client.call("GET", truncated)[:-9])
    client.call("SET", misnamed, client.call("GET", other))  # a valid entry, under another entry's name
    pulled = cli("remote", "pull", server.url, "-o", tmp_path / "pulled.cache")
    assert pulled.returncode == 0, pulled.stderr
    assert "37 entries of 1 origins, 3 left out" in pulled.stdout
    for name in (garbage, truncated, misnamed):
        assert f"left out {name[len(prefix):]}" in pulled.stderr
    assert "holds the entry named" in pulled.stderr
    assert "37 entries" in cli("validate", tmp_path / "pulled.cache").stdout  # nothing bad reached the file
    report = json.loads(cli("remote", "push", source, server.url, "--json").stdout)
    assert report["replaced"] == 3 and report["stored"] == 3 and report["unchanged"] == 37
    assert cli("remote", "pull", server.url, "-o", tmp_path / "again.cache").returncode == 0
    assert same_cache(cli, source, tmp_path / "again.cache")


def test_keys_of_another_format_version_are_never_read_and_prune_removes_them(cli, synth, server, tmp_path):
    source = synth("a.cache", 20)
    assert cli("remote", "push", source, server.url).returncode == 0
    client = server.client()
    own = f"cudnn_cache:v{cudnn_cache.FORMAT_VERSION}"
    for key in list(client.scan(own + ":*")):  # the same content under the next and an older version
        for version in (cudnn_cache.FORMAT_VERSION + 1, cudnn_cache.FORMAT_VERSION - 2):
            renamed = key.decode().replace(own, f"cudnn_cache:v{version}", 1)
            client.call("RESTORE", renamed, 0, client.call("DUMP", key), "REPLACE")
    client.call("SET", f"cudnn_cache:v{cudnn_cache.FORMAT_VERSION + 1}:entry:garbage", b"\x00\x01")
    held = json.loads(cli("remote", "stats", server.url, "--json").stdout)
    assert set(held["other_versions"]) == {f"v{cudnn_cache.FORMAT_VERSION + 1}",
                                           f"v{cudnn_cache.FORMAT_VERSION - 2}"}
    pulled = cli("remote", "pull", server.url, "-o", tmp_path / "pulled.cache")
    assert "20 entries of 1 origins, 0 left out" in pulled.stdout  # the others were not even read
    pruned = cli("remote", "prune", server.url, "--other-versions", "--json")
    assert json.loads(pruned.stdout)["deleted"] == 2 * 22 + 1  # 20 entries, a set and a hash per version
    assert json.loads(cli("remote", "stats", server.url, "--json").stdout)["other_versions"] == {}
    tag = next(iter(held["origins"]))
    assert cli("remote", "prune", server.url, "--origin", tag).returncode == 0
    assert json.loads(cli("remote", "stats", server.url, "--json").stdout)["origins"] == {}


def test_the_previous_format_entries_are_pulled_until_pushes_rewrite_them(cli, synth, server, tmp_path):
    """What the previous release pushed (the same keys under the previous format's prefix) is pulled, merged
    under this format's entries; a push writes them in this format, and pruning other versions leaves those."""
    source = synth("a.cache", 20)
    assert cli("remote", "push", source, server.url).returncode == 0
    client = server.client()
    own, previous = f"cudnn_cache:v{cudnn_cache.FORMAT_VERSION}", f"cudnn_cache:v{cudnn_cache.FORMAT_VERSION - 1}"
    for key in list(client.scan(own + ":*")):  # as the previous release left them, and nothing of this one's
        client.call("RENAME", key, key.decode().replace(own, previous, 1))
    assert json.loads(cli("remote", "stats", server.url, "--json").stdout)["origins"] == {}
    pulled = cli("remote", "pull", server.url, "-o", tmp_path / "pulled.cache")
    assert pulled.returncode == 0, pulled.stderr
    assert "20 entries of 1 origins, 0 left out" in pulled.stdout
    assert same_cache(cli, source, tmp_path / "pulled.cache")
    report = json.loads(cli("remote", "push", tmp_path / "pulled.cache", server.url, "--json").stdout)
    assert report["stored"] == 20  # now in this format too
    again = cli("remote", "pull", server.url, "-o", tmp_path / "again.cache")
    assert "20 entries of 1 origins, 0 left out" in again.stdout  # one entry per name, whichever formats hold it
    assert cli("remote", "prune", server.url, "--other-versions").returncode == 0
    assert cli("remote", "pull", server.url, "-o", tmp_path / "own.cache").returncode == 0
    assert same_cache(cli, source, tmp_path / "own.cache")


# --- Faults ---------------------------------------------------------------------------------------------------

def test_a_server_that_is_down_exits_5_within_the_timeout_naming_the_store(cli, synth):
    source = synth("a.cache", 5)
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    done = cli("remote", "push", source, url)
    assert done.returncode == 5 and time.monotonic() - started < 30
    assert "cannot reach the server" in done.stderr and PASSWORD not in done.stderr and ":***@" in done.stderr
    for args in (("stats", url), ("pull", url, "-o", "out.cache"), ("prune", url, "--other-versions")):
        assert cli("remote", *args).returncode == 5


def test_a_wrong_password_exits_5_saying_authentication_failed(cli, synth, tmp_path):
    folder = tmp_path / "redis"
    folder.mkdir()
    guarded = RedisServer(folder, password=PASSWORD)
    try:
        source = synth("a.cache", 5)
        wrong = f"redis://:wrong@127.0.0.1:{guarded.port}/0"
        for url in (wrong, f"redis://127.0.0.1:{guarded.port}/0"):
            done = cli("remote", "push", source, url)
            assert done.returncode == 5 and ("authentication" in done.stderr.lower() or "NOAUTH" in done.stderr)
        assert cli("remote", "push", source, guarded.url).returncode == 0
    finally:
        guarded.kill()


def test_a_slow_server_times_out_after_the_timeout(cli, synth, server):
    source = synth("a.cache", 5)
    os.kill(server.process.pid, signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
    try:
        started = time.monotonic()
        done = cli("remote", "push", source, server.url, "--timeout", "0.5")
        assert done.returncode == 5 and "no answer within the timeout" in done.stderr, done.stderr
        assert time.monotonic() - started < 20
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def test_a_server_out_of_memory_refuses_and_the_file_is_untouched(cli, synth, tmp_path):
    folder = tmp_path / "redis"
    folder.mkdir()
    full = RedisServer(folder, maxmemory=2 * 1024 * 1024)
    try:
        source = synth("a.cache", 20000)
        before = digest(source)
        done = cli("remote", "push", source, full.url)
        assert done.returncode == 5 and "maxmemory" in done.stderr, done.stderr
        assert digest(source) == before
    finally:
        full.kill()


def test_a_server_killed_during_a_push_leaves_the_file_and_a_restarted_one_takes_the_next_push(
        cli, synth, server, tmp_path, child_env):
    source = synth("a.cache", 20000)
    before = digest(source)
    pushing = subprocess.Popen([sys.executable, "-m", "cudnn_cache", "remote", "push", str(source), server.url],
                               env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = server.client()
    deadline = time.monotonic() + 120
    while client.call("DBSIZE") < 100 and time.monotonic() < deadline:  # killed once the push is well under way
        time.sleep(0.01)
    server.kill()
    _, err = pushing.communicate(timeout=120)
    assert pushing.returncode == 5 and "cannot reach the server" in err, err
    assert digest(source) == before
    server.start()  # the same port, empty (no persistence): as a restarted cache server
    store = remote.Remote(server.url)
    assert store.push(source.read_bytes(), str(source)).stored == 20000
    data, report = store.pull()
    assert report.entries == 20000


def test_a_restarted_server_is_reconnected_by_the_same_store(synth, server):
    source = synth("a.cache", 30)
    store = remote.Remote(server.url)
    assert store.push(source.read_bytes(), str(source)).stored == 30
    server.kill()
    server.start()
    assert store.push(source.read_bytes(), str(source)).stored == 30  # the restarted server held nothing


# --- The layer under the local file ---------------------------------------------------------------------------

def test_load_and_save_with_an_unreachable_remote_warn_once_and_keep_the_file(synth, tmp_path, cache_state):
    source = synth("a.cache", 25)
    cudnn_cache.set_remote(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cudnn_cache.load(source) == 25
            saved = tmp_path / "saved.cache"
            assert cudnn_cache.save(saved) == 25
            assert cudnn_cache.save(saved) == 25
        messages = [str(w.message) for w in caught if "remote store" in str(w.message)]
        # Without a GPU, load() pulls nothing (the entries are for this GPU): the first save warns, once.
        assert len(messages) == 1 and "cannot reach the server" in messages[0], messages
        assert "25 entries" in cudnn_cache._ops.file_summary(str(saved))
    finally:
        cudnn_cache.set_remote(None)
    assert cudnn_cache.remote_url() is None


def test_save_pushes_the_files_entries(synth, server, tmp_path, cache_state):
    source = synth("a.cache", 25)
    cudnn_cache.set_remote(server.url)
    try:
        assert cudnn_cache.remote_url() == server.url
        cudnn_cache.load(source)
        cudnn_cache.save(tmp_path / "saved.cache")
    finally:
        cudnn_cache.set_remote(None)
    assert remote.Remote(server.url).pull()[1].entries == 25


@pytest.mark.parametrize("url, message", [
    ("http://host:6379", "the scheme must be redis or rediss"),
    ("redis://", "names no host"),
    ("redis://host:notaport", "Port could not be cast"),
    ("redis://host:70000", "out of range"),
    ("redis://host:6379/zero", "the database must be a number"),
    ("redis://host:6379/0?ssl_ca_certs=/ca.pem", "TLS options go with rediss://"),
    ("rediss://host:6379/0?ssl=1", "takes no query option ssl; rediss:// takes ssl_ca_certs"),
    ("redis://host:6379/0#top", "takes no fragment"),
    ("rediss://host:6379/0?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of required, optional, none"),
    ("rediss://host:6379/0?ssl_keyfile=/client.key", "ssl_keyfile goes with ssl_certfile"),
    ("rediss://host:6379/0?ssl_ca_certs=/a.pem&ssl_ca_certs=/b.pem", "ssl_ca_certs is given 2 times"),
    (":pw@host", "the scheme must be"),
])
def test_bad_urls_are_refused_naming_the_form(url, message, cli):
    with pytest.raises(ValueError, match=message) as refused:
        cudnn_cache.set_remote(url)
    assert "redis://[[user]:password@]host[:port][/db]" in str(refused.value)
    assert cudnn_cache.remote_url() is None
    done = cli("remote", "stats", url)
    assert done.returncode == 2 and message.split()[0] in done.stderr


def test_setting_and_pulling_a_remote_imports_nothing_but_hiredis_beyond_the_standard_library(child_env, server):
    # A warm start from the store has 50 ms (issue 18): redis-py's import alone took 0.5 s on the GPU machine.
    code = ("import sys, cudnn_cache\nbefore = set(sys.modules)\ncudnn_cache.set_remote(sys.argv[1])\n"
            "cudnn_cache.remote.Remote(sys.argv[1]).pull()\n"
            "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
            "print(' '.join(sorted(new - set(sys.stdlib_module_names))))")
    done = subprocess.run([sys.executable, "-c", code, server.url], env=child_env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cudnn_cache", "hiredis"], done.stdout  # beyond Python's standard library


def test_tls_files_that_cannot_be_read_are_refused_naming_them(cli, tmp_path):
    missing = tmp_path / "no-such-ca.pem"
    url = f"rediss://:{PASSWORD}@host:6379/0?ssl_ca_certs={missing}"
    with pytest.raises(ValueError, match="cannot use its TLS files") as refused:
        cudnn_cache.set_remote(url)
    assert PASSWORD not in str(refused.value) and cudnn_cache.remote_url() is None
    done = cli("remote", "stats", url)
    assert done.returncode == 2 and "cannot use its TLS files" in done.stderr and PASSWORD not in done.stderr


def test_a_bad_cudnn_cache_remote_ends_the_process_with_one_line_hiding_the_password(child_env):
    env = dict(child_env, CUDNN_CACHE_REMOTE=f"http://:{PASSWORD}@host:6379")
    done = subprocess.run([sys.executable, "-c", "import cudnn_cache"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "CUDNN_CACHE_REMOTE" in done.stderr and "scheme must be redis or rediss" in done.stderr
    assert PASSWORD not in done.stderr


def test_cudnn_cache_remote_sets_the_store_at_import(child_env, server):
    env = dict(child_env, CUDNN_CACHE_REMOTE=server.url)
    done = subprocess.run([sys.executable, "-c", "import cudnn_cache; print(cudnn_cache.remote_url())"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == server.url, done.stderr


TRAIN = """
import torch, cudnn_cache
x = torch.randn(4, 8, 16, 16, device="cuda", requires_grad=True)
conv = torch.nn.Conv2d(8, 16, 3, padding=1).cuda()
conv(x).sum().backward()
stats = cudnn_cache.stats()
print(stats["tunes"], stats["hits"], stats["entries"])
"""


@pytest.mark.gpu
def test_a_new_machine_with_an_empty_file_starts_from_the_remote_store_without_tuning(server, tmp_path, child_env):
    # The first machine tunes and, at exit, saves its file and pushes it; the second has no file at all.
    for machine, expect_tunes in (("first", True), ("second", False)):
        env = dict(child_env, CUDNN_CACHE_PATH=str(tmp_path / machine / "convs.cache"), CUDNN_CACHE_REMOTE=server.url)
        done = subprocess.run([sys.executable, "-c", TRAIN], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        tunes, hits, entries = map(int, done.stdout.split())
        assert (tunes > 0) == expect_tunes and entries == 3, done.stdout
        if not expect_tunes:
            assert hits >= 3  # forward, backward data and backward filter, from the remote's entries
    assert remote.Remote(server.url).pull()[1].entries == 3


def test_the_runner_layers_the_remote_under_its_file_for_the_script_and_its_children(child_env, server, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, cudnn_cache\nprint(cudnn_cache.remote_url(), os.environ['CUDNN_CACHE_REMOTE'])\n")
    env = dict(child_env, CUDNN_CACHE_PATH="", CUDNN_CACHE_REMOTE="")
    done = subprocess.run([sys.executable, "-m", "cudnn_cache.run", "--cache", str(tmp_path / "convs.cache"),
                           "--remote", server.url, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [server.url, server.url]


def test_a_pulled_checkpoint_is_checked_before_it_is_written(tmp_path):
    target = tmp_path / "pulled.cache"
    with pytest.raises(RuntimeError, match=r"pulled.cache"):
        cudnn_cache._ops.file_write_checkpoint(str(target), remote._tensor(b"not a cache file"))
    with pytest.raises(RuntimeError, match=r"file_write_checkpoint: .*pulled.cache: expected a 1-D uint8 tensor"):
        cudnn_cache._ops.file_write_checkpoint(str(target), torch.zeros(3, dtype=torch.float32))
    assert not target.exists()
