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

so one server holds any number of GPU kinds, cuDNN versions and file formats. A build writes only its own
format's keys and reads its own and the previous format's (its loader reads older checkpoints): a fleet that
upgrades keeps what the previous release pushed until a push rewrites the entry or `remote prune
--other-versions` removes the old keys. A push merges each entry into the server's copy with the file's rule
(per candidate the faster measurement wins) under WATCH/MULTI: the merge is computed here and written only if
nobody wrote the key since it was read, else read and merged again, so concurrent writers lose nothing; an
entry whose merge changes nothing is not written. An entry settle() changed in the saving process takes the
server copy's place instead (Note [A settled key replaces the file's]): a merge with times taken under another
load could put the config it displaced first again.

What comes back is checked exactly like a file and must hold the one entry its name says; an entry that fails
is left out and counted, never merged, and a push replaces it. A server that is down, slow or full costs at
most the timeouts (connect and command, one second each by default) and raises RemoteError; load() and save()
turn that into one warning and go on with the local file.

The client is `Connection`: hiredis (the Redis project's protocol parser) under a socket. Not redis-py, whose
import alone costs 0.5 s on the GPU machine, ten times a warm start from the store; not Debian 12's C hiredis
in the core, which has no TLS. So the remote layer is Python's: a LibTorch process uses a file that
`python -m cudnn_cache remote pull URL -o FILE` wrote.
"""

import dataclasses
import itertools
import socket
import time
import urllib.parse
from typing import Collection, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

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
_CERT_REQUIREMENTS = ("required", "optional", "none")  # ssl_cert_reqs: how the server's certificate is checked


def check_url(url: str) -> str:
    """Returns the URL if it names a Redis server cudnn_cache can use: redis:// or rediss://, a host, an
    optional port (1-65535), an optional database number, and for rediss:// the TLS options of TLS_OPTIONS as
    a query (e.g. ?ssl_ca_certs=/etc/ca.pem for a private CA); raises ValueError naming it and the form it takes."""
    form = ("redis://[[user]:password@]host[:port][/db] (rediss:// for TLS, with ?ssl_ca_certs=CA.pem and the like), "
            "e.g. redis://cache-host:6379/0")
    if not isinstance(url, str):
        raise ValueError(f"a remote store is a URL string of the form {form}, not {type(url).__name__}")

    def refuse(reason: str):
        raise ValueError(f"remote store {redacted(url)!r}: {reason}; the form is {form}") from None

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as error:
        refuse(str(error))
    if parts.scheme not in ("redis", "rediss"):
        refuse(f"the scheme must be redis or rediss, not {parts.scheme or 'missing'}")
    if not parts.hostname:
        refuse("names no host")
    if port == 0:
        refuse("port 0 is not a port")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        refuse(f"the database must be a number, not {path!r}")
    if parts.fragment:
        refuse("takes no fragment")
    options = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    allowed = TLS_OPTIONS if parts.scheme == "rediss" else ()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        refuse(f"takes no query option {', '.join(unknown)}; "
               + (f"rediss:// takes {', '.join(TLS_OPTIONS)}" if allowed else "TLS options go with rediss://"))
    for option, values in options.items():
        if len(values) > 1:
            refuse(f"{option} is given {len(values)} times; give it once")
    requirement = options.get("ssl_cert_reqs", ["required"])[0]
    if requirement not in _CERT_REQUIREMENTS:
        refuse(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQUIREMENTS)}, not {requirement!r}")
    if "ssl_keyfile" in options and "ssl_certfile" not in options:
        refuse("ssl_keyfile goes with ssl_certfile (the client's certificate); give both")
    return url


def url_argument(text: str) -> str:
    """An argparse type: a URL check_url takes, with TLS files that can be read (the CLI's remote commands,
    --remote of the runner and of scripts/warm_start.py)."""
    import argparse

    try:
        if check_url(text).startswith("rediss:"):
            _tls_context(text)  # its files too
        return text
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


def split(data: bytes, source: str) -> List[Tuple[str, str, bytes]]:
    """Every entry of a checkpoint (a cache file's bytes) on its own: (name, its origin in words, bytes)."""
    names, origins, blob, ends = _ops.split_entries(_tensor(data), source)
    raw = blob.numpy().tobytes()
    return [(name, origin, raw[begin:end]) for name, origin, begin, end in zip(names, origins, [0, *ends], ends)]


def merge(blobs: List[bytes], names: List[str], source: str) -> Tuple[bytes, List[Tuple[int, str]]]:
    """The checkpoint of the single-entry checkpoints `blobs` merged, each checked to be the entry of its
    name; and (index, reason) for each left out."""
    ends = list(itertools.accumulate(len(blob) for blob in blobs))
    merged, refused, reasons = _ops.merge_entries(_tensor(b"".join(blobs)), ends, names, source)
    return merged.numpy().tobytes(), list(zip(refused, reasons))


class ServerError(Exception):
    """An error reply of the server (OOM, NOAUTH, WRONGPASS, ...), with the server's own text."""


def _tls_context(url: str):
    """The TLS context of a rediss:// URL's options (check_url took them): the server's certificate checked
    against ssl_ca_certs (default: the system's CAs) and its host name, unless ssl_cert_reqs says otherwise; the
    client's own certificate from ssl_certfile/ssl_keyfile. A file that cannot be read raises ValueError."""
    import ssl

    options = {name: values[0] for name, values in
               urllib.parse.parse_qs(urllib.parse.urlsplit(url).query, keep_blank_values=True).items()}
    try:
        context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
        if "ssl_certfile" in options:
            context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"remote store {redacted(url)!r}: cannot use its TLS files ({error}); ssl_ca_certs, "
                         f"ssl_certfile and ssl_keyfile name PEM files this process can read") from None
    requirement = options.get("ssl_cert_reqs", "required")
    if requirement != "required":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_OPTIONAL if requirement == "optional" else ssl.CERT_NONE
    return context


class Connection:
    """One connection to the Redis server of a URL check_url takes. Commands are packed and replies parsed by
    hiredis; `pipeline` sends several in one round trip. It connects on first use (within `connect_timeout`
    seconds, TLS for rediss://), logs in with the URL's password and selects its database; every exchange
    gives up after `timeout` seconds (TimeoutError). Any failure closes it and raises (OSError, or ServerError
    when the login is refused), and the next command connects again. A connection the server closed since its
    last use (a restart) is opened again once without the caller noticing, unless retry=False: a transaction
    after WATCH must fail rather than run on a new connection that watches nothing."""

    def __init__(self, url: str, timeout: float = TIMEOUT_SECONDS, connect_timeout: Optional[float] = None):
        try:
            import hiredis
        except ImportError:
            raise ImportError("cudnn_cache's remote store needs hiredis (Redis's protocol parser): pip install "
                              "'hiredis>=2.2.1' (or install cudnn_cache with the extra: pip install "
                              "'cudnn_cache[remote]')") from None
        self._hiredis = hiredis
        parts = urllib.parse.urlsplit(check_url(url))
        self._address = (parts.hostname, parts.port or 6379)
        self._timeout = timeout
        self._connect_timeout = connect_timeout or timeout
        self._tls = _tls_context(url) if parts.scheme == "rediss" else None
        self._login: List[tuple] = []
        if parts.password:
            password = urllib.parse.unquote(parts.password)
            user = urllib.parse.unquote(parts.username or "")
            self._login.append(("AUTH", user, password) if user else ("AUTH", password))
        if int(parts.path.strip("/") or 0):
            self._login.append(("SELECT", int(parts.path.strip("/"))))
        self._socket: Optional[socket.socket] = None
        self._reader = None

    def call(self, *command, retry: bool = True):
        """The reply to one command; an error reply raises ServerError."""
        return self.checked(self.pipeline([command], retry))[0]

    def pipeline(self, commands: Sequence[tuple], retry: bool = True) -> list:
        """The replies to `commands`, sent in one round trip. Error replies come back as hiredis.ReplyError
        values, in their place (see checked)."""
        may_be_stale = retry and self._socket is not None
        while True:
            try:
                if self._socket is None:
                    self._connect()
                return self._exchange(commands)
            except BaseException as error:
                self.close()
                if not (may_be_stale and isinstance(error, ConnectionError)):
                    raise
                may_be_stale = False  # once, on a new connection

    def checked(self, replies: list) -> list:
        """`replies`, or ServerError for the first error among them (or among the replies of an EXEC)."""
        for reply in replies:
            for part in reply if isinstance(reply, list) else (reply,):
                if isinstance(part, self._hiredis.ReplyError):
                    raise ServerError(str(part))
        return replies

    def scan(self, match: str) -> Iterator[bytes]:
        """Every key matching the glob `match`, by SCAN (the server never blocks on a long KEYS)."""
        cursor = b"0"
        while True:
            cursor, keys = self.call("SCAN", cursor, "MATCH", match, "COUNT", 1000)
            yield from keys
            if cursor == b"0":
                return

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
        self._socket = self._reader = None

    def _connect(self) -> None:
        connection = socket.create_connection(self._address, timeout=self._connect_timeout)
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:  # the handshake, within the connect timeout
                connection = self._tls.wrap_socket(connection, server_hostname=self._address[0])
            connection.settimeout(self._timeout)
        except BaseException:
            connection.close()
            raise
        self._socket, self._reader = connection, self._hiredis.Reader()
        if self._login:
            self.checked(self._exchange(self._login))

    def _exchange(self, commands: Sequence[tuple]) -> list:
        self._socket.sendall(b"".join(self._hiredis.pack_command(command) for command in commands))
        replies: list = []
        while len(replies) < len(commands):
            reply = self._reader.gets()
            if reply is False:  # not a whole reply yet
                data = self._socket.recv(1 << 20)
                if not data:
                    raise ConnectionError("the server closed the connection")
                self._reader.feed(data)
            else:
                replies.append(reply)
        return replies


class Remote:
    """The entries on a Redis server (Note [Remote store]). Every command times out after `timeout` seconds
    (connecting after `connect_timeout`) and raises RemoteError."""

    def __init__(self, url: str, timeout: float = TIMEOUT_SECONDS, connect_timeout: Optional[float] = None):
        self.url = check_url(url)
        self.name = redacted(url)
        for label, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"remote store {self.name}: {label} must be a number of seconds > 0, not {value!r}")
        self._connection = Connection(url, timeout, connect_timeout)
        self.prefix = f"cudnn_cache:v{_ops.format_version()}"
        self.previous_prefix = f"cudnn_cache:v{_ops.format_version() - 1}"  # read by pull, never written

    def _entries_key(self, tag: str, prefix: Optional[str] = None) -> str:
        return f"{prefix or self.prefix}:entries:{tag}"

    @property
    def _origins_key(self) -> str:
        return f"{self.prefix}:origins"

    def _entry_key(self, name: str, prefix: Optional[str] = None) -> str:
        return f"{prefix or self.prefix}:entry:{name}"

    def _call(self, what: str, function):
        try:
            return function()
        except TimeoutError as error:
            raise RemoteError(f"remote store {self.name}: no answer within the timeout while it {what} "
                              f"({error})") from None
        except ServerError as error:  # e.g. OOM when the server is full, READONLY, a refused login
            if str(error).startswith(("NOAUTH", "WRONGPASS", "ERR invalid password", "ERR AUTH")):
                raise RemoteError(f"remote store {self.name}: authentication failed ({error}) while it {what}; "
                                  f"give the server's password in the URL: redis://:PASSWORD@host:port/db") from None
            raise RemoteError(f"remote store {self.name}: the server refused while it {what}: {error}") from None
        except OSError as error:  # refused, reset, closed, unknown host, TLS
            raise RemoteError(f"remote store {self.name}: cannot reach the server while it {what} ({error})") from None

    # -- push ------------------------------------------------------------------------------------------------
    def push(self, data: bytes, source: str, replacing: Collection[str] = ()) -> PushReport:
        """Merges every entry of the checkpoint `data` (a cache file's bytes; `source` names it in errors)
        into the server's copy (Note [Remote store]); the entries named in `replacing` (those settle() changed,
        Note [A settled key replaces the file's]) are written in place of the server's copies instead."""
        started = time.perf_counter()
        entries = split(data, source)
        report = PushReport(entries=len(entries))
        # One round trip finds the entries the server already holds as they are: no news, no write.
        current = self._call("read entries", lambda: self._mget([self._entry_key(name) for name, _, _ in entries]))
        for (name, origin, blob), held in zip(entries, current):
            if held == blob:
                report.unchanged += 1
            else:
                overwrite = name in replacing
                self._call(f"wrote {name}", lambda: self._merge_one(name, origin, blob, report, overwrite))
        report.seconds = time.perf_counter() - started
        return report

    def _merge_one(self, name: str, origin: str, blob: bytes, report: PushReport, overwrite: bool = False) -> None:
        # `overwrite` writes `blob` in place of the server's copy, unmerged (an entry settle() changed). Two round
        # trips: WATCH with the read, then the transaction, which the server drops (EXEC answers nil) when another
        # writer wrote the key since the WATCH; then it is read and merged again.
        key = self._entry_key(name)
        tag = name.split(":", 1)[0]
        connection = self._connection
        for _ in range(_WRITE_ATTEMPTS):
            _, held = connection.checked(connection.pipeline([("WATCH", key), ("GET", key)]))
            replaced = False  # whether the server's copy failed its checks and ours took its place
            if held is None or overwrite:
                new = blob
            else:
                new, refused = merge([held, blob], [name, name], f"remote store {self.name}")
                if refused:  # the server's copy failed the checks (ours was checked by split)
                    new, replaced = blob, True
            if new == held:
                connection.call("UNWATCH")
                report.unchanged += 1
                return
            written = connection.checked(connection.pipeline(
                [("MULTI",), ("SET", key, new), ("SADD", self._entries_key(tag), name),
                 ("HSET", self._origins_key, tag, origin), ("EXEC",)], retry=False))
            if written[-1] is not None:
                report.stored += 1
                report.replaced += replaced
                return
            report.retries += 1
        raise RemoteError(f"remote store {self.name}: {name} kept changing under {_WRITE_ATTEMPTS} attempts to "
                          f"merge into it; push again")

    # -- pull ------------------------------------------------------------------------------------------------
    def origins(self) -> Dict[str, str]:
        """The origins the server holds entries of: tag -> the origin in words."""
        held = self._call("listed origins", lambda: self._connection.call("HGETALL", self._origins_key))
        pairs = zip(held[0::2], held[1::2])
        return {tag.decode(): origin.decode(errors="replace") for tag, origin in sorted(pairs)}

    def pull(self, origins: Optional[Iterable[str]] = None) -> Tuple[bytes, PullReport]:
        """A checkpoint (a cache file's bytes) of every entry the server holds of these origins (tags; default:
        all of them), of this format and the previous one, merged, each checked; and what was left out."""
        started = time.perf_counter()
        prefixes = (self.prefix, self.previous_prefix)
        if origins is None:
            held = self._call("listed origins", lambda: self._connection.checked(
                self._connection.pipeline([("HGETALL", f"{prefix}:origins") for prefix in prefixes])))
            tags = sorted({tag.decode() for reply in held for tag in reply[0::2]})
        else:
            tags = sorted(set(origins))
        wanted: List[Tuple[str, str]] = []  # (entry name, key): this format's first, then the previous one's
        for index, members in enumerate(self._call("listed entries", lambda: self._members(tags, prefixes))):
            prefix = prefixes[index // len(tags)]
            wanted += [(name, self._entry_key(name, prefix))
                       for name in sorted(member.decode(errors="replace") for member in members)]
        blobs = self._call("read entries", lambda: self._mget([key for _, key in wanted]))
        present = [(name, blob) for (name, _), blob in zip(wanted, blobs) if blob is not None]  # pruned meanwhile
        data, refused = merge([blob for _, blob in present], [name for name, _ in present],
                              f"remote store {self.name}")
        left_out = {i for i, _ in refused}
        report = PullReport(entries=len({name for i, (name, _) in enumerate(present) if i not in left_out}),
                            origins=len(tags), refused=[(present[i][0], reason) for i, reason in refused])
        report.seconds = time.perf_counter() - started
        return data, report

    def _members(self, tags: List[str], prefixes: Sequence[str] = ()) -> List[List[bytes]]:
        """The entry names of each origin in `tags` under each of `prefixes` (default: this format's), prefix by
        prefix, in one round trip."""
        commands = [("SMEMBERS", self._entries_key(tag, prefix)) for prefix in prefixes or (self.prefix,)
                    for tag in tags]
        return self._connection.checked(self._connection.pipeline(commands)) if commands else []

    def _over_keys(self, command: str, keys: list) -> list:
        """`command` over `keys` in one round trip, as commands of at most _CHUNK keys each: their replies."""
        chunks = [(command, *keys[begin:begin + _CHUNK]) for begin in range(0, len(keys), _CHUNK)]
        return self._connection.checked(self._connection.pipeline(chunks)) if chunks else []

    def _mget(self, keys: List[str]) -> List[Optional[bytes]]:
        """The values of `keys` (None where there is none), in one round trip."""
        return [value for reply in self._over_keys("MGET", keys) for value in reply]

    # -- inspect and prune -----------------------------------------------------------------------------------
    def stats(self) -> dict:
        """What the server holds: per origin of this format, its entries and their bytes; and the keys of
        other versions of the format (of which pull reads the previous one's)."""
        def count() -> dict:
            result = {"url": self.name, "format_version": int(_ops.format_version()), "origins": {},
                      "other_versions": {}}
            origins = self.origins()
            for (tag, origin), members in zip(origins.items(), self._members(list(origins))):
                sizes = self._connection.checked(self._connection.pipeline(
                    [("STRLEN", self._entry_key(member.decode())) for member in members])) if members else []
                result["origins"][tag] = {"origin": origin, "entries": sum(size > 0 for size in sizes),
                                          "bytes": sum(sizes)}
            for key in self._connection.scan("cudnn_cache:v*"):
                version = key.decode(errors="replace").split(":", 2)[1]
                if version != self.prefix.split(":")[1]:
                    result["other_versions"][version] = result["other_versions"].get(version, 0) + 1
            return result
        return self._call("counted entries", count)

    def prune(self, origins: Optional[Iterable[str]] = None, other_versions: bool = False) -> int:
        """Deletes every entry of these origins (tags) and, with other_versions, every key of another version
        of the format; returns the keys deleted."""
        def delete_all(keys: List) -> int:  # names (str) or keys as the server gave them (bytes)
            return sum(self._over_keys("DEL", keys))

        def delete() -> int:
            deleted = 0
            tags = sorted(set(origins or ()))
            for tag, members in zip(tags, self._members(tags)):
                deleted += delete_all([self._entry_key(member.decode()) for member in members])
                deleted += delete_all([self._entries_key(tag)])
                self._connection.call("HDEL", self._origins_key, tag)
            if other_versions:
                own = (self.prefix + ":").encode()
                deleted += delete_all([key for key in self._connection.scan("cudnn_cache:v*")
                                       if not key.startswith(own)])
            return deleted
        return self._call("deleted entries", delete)
