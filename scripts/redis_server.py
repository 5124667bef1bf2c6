"""A redis-server of its own on a free loopback port, for tests/python/test_remote.py and scripts/bench_remote.py:
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
    with noeviction: a full server refuses writes) when given. Raises RuntimeError if it does not start."""

    def __init__(self, folder: pathlib.Path, password: Optional[str] = None, maxmemory: Optional[int] = None):
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed (scripts/install_deps.sh installs Debian's)")
        self.folder, self.password, self.maxmemory = pathlib.Path(folder), password, maxmemory
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: Optional[subprocess.Popen] = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://{':' + self.password + '@' if self.password else ''}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Starts it (again, on the same port) and waits until it takes connections."""
        command = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", str(self.folder), "--logfile", str(self.folder / "redis.log")]
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
        """A redis-py client of it, to look at or damage what it holds."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def __enter__(self) -> "RedisServer":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
