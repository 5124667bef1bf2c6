"""A redis-server of its own on a free loopback port, for tests/python/test_remote.py and benchmarks/remote.py:
started in a folder, without persistence (a restart starts empty, as a cache server's would), stopped or killed."""

import pathlib
import shutil
import socket
import subprocess
import time
from typing import Optional

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    """A TCP port nothing listens on now, on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """redis-server on 127.0.0.1:`port`, its log in `folder`; `password` (requirepass) and `maxmemory` (bytes,
    with noeviction: a full server refuses writes) when given; with `tls`, TLS only, with a certificate of a CA
    of its own (made with openssl in `folder`; `ca` is its path, for the client). Raises RuntimeError if it does
    not start."""

    def __init__(self, folder: pathlib.Path, password: Optional[str] = None, maxmemory: Optional[int] = None,
                 tls: bool = False):
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed (scripts/install_deps.sh installs Debian's)")
        self.folder, self.password, self.maxmemory = pathlib.Path(folder), password, maxmemory
        self.folder.mkdir(parents=True, exist_ok=True)
        self.tls = tls
        self.ca = self.folder / "ca.crt"
        if tls:
            self._make_certificates()
        self.port = free_port()
        self.process: Optional[subprocess.Popen] = None
        self.start()

    @property
    def url(self) -> str:
        scheme, query = ("rediss", f"?ssl_ca_certs={self.ca}") if self.tls else ("redis", "")
        return f"{scheme}://{':' + self.password + '@' if self.password else ''}127.0.0.1:{self.port}/0{query}"

    def _make_certificates(self) -> None:
        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=self.folder, check=True, capture_output=True)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                "-subj", "/CN=cudnn_cache test CA")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj",
                "/CN=127.0.0.1")
        (self.folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
                "server.crt", "-days", "2", "-extfile", "san.cnf")

    def start(self) -> None:
        """Starts it (again, on the same port) and waits until it takes connections."""
        command = [REDIS_SERVER, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.folder),
                   "--logfile", str(self.folder / "redis.log")]
        if self.tls:
            command += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", "server.crt",
                        "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"]
        else:
            command += ["--port", str(self.port)]
        if self.password:
            command += ["--requirepass", self.password]
        if self.maxmemory:
            command += ["--maxmemory", str(self.maxmemory), "--maxmemory-policy", "noeviction"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.process.poll() is not None:
                    log = self.folder / "redis.log"
                    raise RuntimeError(f"redis-server exited: {log.read_text()[-2000:] if log.exists() else ''}")
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start within 20 s")

    def kill(self) -> None:
        """SIGKILL, as a crash would; a later start() is a restart on the same port."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def client(self):
        """A connection to it (cudnn_cache.remote.Connection: call, scan), to look at or damage what it holds."""
        from cudnn_cache.remote import Connection

        return Connection(self.url, timeout=30)

    def __enter__(self) -> "RedisServer":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
