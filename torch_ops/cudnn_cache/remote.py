"""A shared store of tuning on Redis, for a fleet without a shared file system (Note [Remote store]).

    cudnn_cache.set_remote("redis://cache-host:6379/0")    # or CUDNN_CACHE_REMOTE; rediss:// for TLS
    cudnn_cache.load(path)    # the file, then this GPU's entries from the remote, merged
    cudnn_cache.save(path)    # the file, then its entries pushed, each merged on the server

    python -m cudnn_cache remote stats|pull|push|prune ...   (no GPU needed)

Note [Remote store]
~~~~~~~~~~~~~~~~~~~
The local file stays the first source and works offline; the remote is a layer under it. Each entry lives on
the server on its own, as a checkpoint that holds just it (Note [Entries on a shared store] in exchange.h), under

    cudnn_cache:v<format>:entry:<origin tag>:<entry tag>   the entry's checkpoint bytes
    cudnn_cache:v<format>:entries:<origin tag>              a set of the origin's entry names
    cudnn_cache:v<format>:origins                           a hash: origin tag -> the origin, in words

so a server can hold any number of GPU kinds and cuDNN versions, and two versions of the file format share a
server without reading each other's keys. A push merges each entry into the server's copy with the file's
rule (per candidate the faster measurement wins), under WATCH/MULTI: the merge is computed here, and the write
happens only if nobody wrote the key since it was read, else it is read and merged again. Any number of writers
lose nothing, and an entry whose merge changes nothing is not written.

What comes back is checked exactly like a file (the checkpoint's magic, versions, sizes, enums and checksum),
and must hold the one entry its name says; an entry that fails is left out and counted, never merged, and a
push replaces it. A server that is down, slow, restarted or out of memory costs at most the timeouts
(connect and command, one second each by default) and raises RemoteError; load() and save() with a remote
set turn that into one warning and go on with the local file. rediss:// (TLS) takes ?ssl_ca_certs=CA.pem for a
private CA.

The client is redis-py (PyPI), not hiredis from Debian: Debian 12's hiredis is 0.14, which has no TLS, and
rediss:// is part of what a fleet needs. So the remote layer is Python's: a LibTorch process uses a file that
`python -m cudnn_cache remote pull URL -o FILE` wrote.
"""

import dataclasses
import time
import urllib.parse
from typing import Dict, Iterable, List, Optional, Tuple

import torch

_ops = torch.ops.cudnn_cache

TIMEOUT_SECONDS = 1.0
_WRITE_ATTEMPTS = 50  # per entry, against writers that keep changing it under us
_CHUNK = 2000  # keys per MGET


class RemoteError(RuntimeError):
    """The remote store could not be reached, timed out, or refused a command; the message names the store
    (without its password) and what failed."""


def redacted(url: str) -> str:
    """The URL with its password (if any) replaced by ***, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    credentials, at, host = parts.netloc.rpartition("@")
    if not at or ":" not in credentials:  # no password (a bad port is left for check_url to name)
        return url
    user = credentials.split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")  # rediss:// URL query options


def check_url(url: str) -> str:
    """Returns the URL if it names a Redis server cudnn_cache can use: redis:// or rediss://, a host, an
    optional port (1-65535), an optional database number, and for rediss:// the TLS options of TLS_OPTIONS as
    a query (e.g. ?ssl_ca_certs=/etc/ca.pem for a private CA); raises ValueError naming it and the form it takes."""
    form = ("redis://[[user]:password@]host[:port][/db] (rediss:// for TLS, with ?ssl_ca_certs=CA.pem and the like), "
            "e.g. redis://cache-host:6379/0")
    if not isinstance(url, str):
        raise ValueError(f"a remote store is a URL string of the form {form}, not {type(url).__name__}")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"remote store {redacted(url)!r}: {error}; the form is {form}") from None
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"remote store {redacted(url)!r}: the scheme must be redis or rediss, not "
                         f"{parts.scheme or 'missing'}; the form is {form}")
    if not parts.hostname:
        raise ValueError(f"remote store {redacted(url)!r} names no host; the form is {form}")
    if port == 0:
        raise ValueError(f"remote store {redacted(url)!r}: port 0 is not a port; the form is {form}")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"remote store {redacted(url)!r}: the database must be a number, not {path!r}; the form "
                         f"is {form}")
    if parts.fragment:
        raise ValueError(f"remote store {redacted(url)!r}: takes no fragment; the form is {form}")
    options = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    allowed = TLS_OPTIONS if parts.scheme == "rediss" else ()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"remote store {redacted(url)!r}: takes no query option {', '.join(unknown)}; "
                         + (f"rediss:// takes {', '.join(TLS_OPTIONS)}" if allowed else
                            "TLS options go with rediss://") + f"; the form is {form}")
    return url


def url_argument(text: str) -> str:
    """An argparse type: a URL check_url takes (the CLI's remote commands, --remote of the runner and of
    scripts/warm_start.py)."""
    import argparse

    try:
        return check_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@dataclasses.dataclass
class PushReport:
    """What a push did: of `entries` sent, `stored` were new or improved the server's copy, `unchanged` were
    no news to it; `replaced` server copies that failed the checks were overwritten; `retries` merges were
    done again because another writer changed the entry first."""

    entries: int = 0
    stored: int = 0
    unchanged: int = 0
    replaced: int = 0
    retries: int = 0
    seconds: float = 0.0


@dataclasses.dataclass
class PullReport:
    """What a pull did: `entries` merged from `origins` origins; `refused`, the entries left out, each
    (name, reason)."""

    entries: int = 0
    origins: int = 0
    refused: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def _tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def _bytes(tensor: torch.Tensor) -> bytes:
    return tensor.numpy().tobytes()


def split(data: bytes, source: str) -> List[Tuple[str, str, bytes]]:
    """Every entry of a checkpoint (a cache file's bytes) on its own: (name, its origin in words, bytes)."""
    names, origins, blob, ends = _ops.split_entries(_tensor(data), source)
    raw, result, begin = _bytes(blob), [], 0
    for name, origin, end in zip(names, origins, ends):
        result.append((name, origin, raw[begin:end]))
        begin = end
    return result


def merge(blobs: List[bytes], names: List[str], source: str) -> Tuple[bytes, List[Tuple[int, str]]]:
    """The checkpoint of the single-entry checkpoints `blobs` merged, each checked to be the entry of its
    name; and (index, reason) for each left out."""
    ends, total = [], 0
    for blob in blobs:
        total += len(blob)
        ends.append(total)
    merged, refused, reasons = _ops.merge_entries(_tensor(b"".join(blobs)), ends, names, source)
    return _bytes(merged), list(zip(refused, reasons))


class Remote:
    """A connection to a Redis server that holds entries (Note [Remote store]). Every command times out after
    `timeout` seconds (connecting after `connect_timeout`) and raises RemoteError."""

    def __init__(self, url: str, timeout: float = TIMEOUT_SECONDS, connect_timeout: Optional[float] = None):
        try:
            import redis
        except ImportError:
            raise ImportError("cudnn_cache's remote store needs redis-py: pip install 'redis[hiredis]>=5' (or install "
                              "cudnn_cache with the extra: pip install 'cudnn_cache[remote]')") from None
        self.url = check_url(url)
        self.name = redacted(url)
        for label, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"remote store {self.name}: {label} must be a number of seconds > 0, not {value!r}")
        self._redis = redis
        self._client = redis.Redis.from_url(url, socket_timeout=timeout,
                                            socket_connect_timeout=connect_timeout or timeout)
        self.prefix = f"cudnn_cache:v{_ops.format_version()}"

    def _entries_key(self, tag: str) -> str:
        return f"{self.prefix}:entries:{tag}"

    @property
    def _origins_key(self) -> str:
        return f"{self.prefix}:origins"

    def _entry_key(self, name: str) -> str:
        return f"{self.prefix}:entry:{name}"

    def _call(self, what: str, function):
        try:
            return function()
        except self._redis.exceptions.AuthenticationError as error:
            raise RemoteError(f"remote store {self.name}: authentication failed ({error}) while it {what}; give "
                              f"the server's password in the URL: redis://:PASSWORD@host:port/db") from None
        except self._redis.exceptions.TimeoutError as error:
            raise RemoteError(f"remote store {self.name}: no answer within the timeout while it {what} "
                              f"({error})") from None
        except self._redis.exceptions.ConnectionError as error:
            raise RemoteError(f"remote store {self.name}: cannot reach the server while it {what} ({error})") from None
        except self._redis.exceptions.RedisError as error:  # e.g. OOM when the server is full, READONLY
            raise RemoteError(f"remote store {self.name}: the server refused while it {what}: {error}") from None

    def ping(self) -> None:
        self._call("answered a ping", self._client.ping)

    # -- push ------------------------------------------------------------------------------------------------
    def push(self, data: bytes, source: str) -> PushReport:
        """Merges every entry of the checkpoint `data` (a cache file's bytes; `source` names it in errors)
        into the server's copy (Note [Remote store])."""
        started = time.perf_counter()
        entries = split(data, source)
        report = PushReport(entries=len(entries))
        # One round trip finds the entries the server already holds as they are: no news, no write.
        current = self._call("read entries", lambda: self._mget([self._entry_key(name) for name, _, _ in entries]))
        for (name, origin, blob), held in zip(entries, current):
            if held == blob:
                report.unchanged += 1
            else:
                self._call(f"wrote {name}", lambda: self._merge_one(name, origin, blob, report))
        report.seconds = time.perf_counter() - started
        return report

    def _merge_one(self, name: str, origin: str, blob: bytes, report: PushReport) -> None:
        key = self._entry_key(name)
        tag = name.split(":", 1)[0]
        entries_key = self._entries_key(tag)
        for _ in range(_WRITE_ATTEMPTS):
            with self._client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    held = pipe.get(key)
                    replaced = False
                    if held is None:
                        new = blob
                    else:
                        new, refused = merge([held, blob], [name, name], f"remote store {self.name}")
                        if refused:  # the server's copy failed the checks (ours was checked by split)
                            new, replaced = blob, True
                    if new == held:
                        pipe.unwatch()
                        report.unchanged += 1
                        return
                    pipe.multi()
                    pipe.set(key, new)
                    pipe.sadd(entries_key, name)
                    pipe.hset(self._origins_key, tag, origin)
                    pipe.execute()
                    report.stored += 1
                    report.replaced += replaced
                    return
                except self._redis.exceptions.WatchError:
                    report.retries += 1
        raise RemoteError(f"remote store {self.name}: {name} kept changing under {_WRITE_ATTEMPTS} attempts to "
                          f"merge into it; push again")

    # -- pull ------------------------------------------------------------------------------------------------
    def origins(self) -> Dict[str, str]:
        """The origins the server holds entries of: tag -> the origin in words."""
        held = self._call("listed origins", lambda: self._client.hgetall(self._origins_key))
        return {tag.decode(): origin.decode(errors="replace") for tag, origin in sorted(held.items())}

    def pull(self, origins: Optional[Iterable[str]] = None) -> Tuple[bytes, PullReport]:
        """A checkpoint (a cache file's bytes) of every entry the server holds of these origins (tags; default:
        all of them), merged, each checked; and what was left out."""
        started = time.perf_counter()
        tags = sorted(self.origins()) if origins is None else sorted(set(origins))
        names: List[str] = []
        for tag in tags:
            members = self._call("listed entries", lambda: self._client.smembers(self._entries_key(tag)))
            names += sorted(member.decode(errors="replace") for member in members)
        blobs = self._call("read entries", lambda: self._mget([self._entry_key(name) for name in names]))
        present = [(name, blob) for name, blob in zip(names, blobs) if blob is not None]  # pruned meanwhile
        data, refused = merge([blob for _, blob in present], [name for name, _ in present],
                              f"remote store {self.name}")
        report = PullReport(entries=len(present) - len(refused), origins=len(tags),
                            refused=[(present[i][0], reason) for i, reason in refused])
        report.seconds = time.perf_counter() - started
        return data, report

    def _mget(self, keys: List[str]) -> List[Optional[bytes]]:
        values: List[Optional[bytes]] = []
        for begin in range(0, len(keys), _CHUNK):
            values += self._client.mget(keys[begin:begin + _CHUNK])
        return values

    # -- inspect and prune -----------------------------------------------------------------------------------
    def stats(self) -> dict:
        """What the server holds: per origin of this format, its entries and their bytes; and the keys of
        other versions of the format (which this version never reads)."""
        def count() -> dict:
            result = {"url": self.name, "format_version": int(_ops.format_version()), "origins": {},
                      "other_versions": {}}
            for tag, origin in self.origins().items():
                names = [self._entry_key(m.decode()) for m in self._client.smembers(self._entries_key(tag))]
                pipe = self._client.pipeline(transaction=False)
                for key in names:
                    pipe.strlen(key)
                sizes = pipe.execute()
                result["origins"][tag] = {"origin": origin, "entries": sum(size > 0 for size in sizes),
                                          "bytes": sum(sizes)}
            for key in self._client.scan_iter(match="cudnn_cache:v*", count=1000):
                version = key.decode(errors="replace").split(":", 2)[1]
                if version != self.prefix.split(":")[1]:
                    result["other_versions"][version] = result["other_versions"].get(version, 0) + 1
            return result
        return self._call("counted entries", count)

    def prune(self, origins: Optional[Iterable[str]] = None, other_versions: bool = False) -> int:
        """Deletes every entry of these origins (tags) and, with other_versions, every key of another version
        of the format; returns the keys deleted."""
        def delete() -> int:
            deleted = 0
            for tag in sorted(set(origins or ())):
                entries_key = self._entries_key(tag)
                keys = [self._entry_key(m.decode()) for m in self._client.smembers(entries_key)]
                for begin in range(0, len(keys), _CHUNK):
                    deleted += self._client.delete(*keys[begin:begin + _CHUNK])
                deleted += self._client.delete(entries_key)
                self._client.hdel(self._origins_key, tag)
            if other_versions:
                own = self.prefix + ":"
                stale = [k for k in self._client.scan_iter(match="cudnn_cache:v*", count=1000)
                         if not k.decode(errors="replace").startswith(own)]
                for begin in range(0, len(stale), _CHUNK):
                    deleted += self._client.delete(*stale[begin:begin + _CHUNK])
            return deleted
        return self._call("deleted entries", delete)
