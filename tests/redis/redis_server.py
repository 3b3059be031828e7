"""A real ``redis-server`` for tests: a free loopback port, a temp dir, stop/restart on demand.

Never a fake: the shared-state tests run against the same server binary production uses. The
server keeps an append-only file (``appendfsync everysec``; a graceful stop flushes it) so a test
can stop it and restart it on the same port with its data, as a persistent production Redis would.

``REDIS_SERVER`` overrides the binary; tests are skipped (with the reason) only when no binary is
found at all.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def redis_server_binary() -> str | None:
    """Path of the ``redis-server`` binary, or None."""
    env = os.environ.get("REDIS_SERVER")
    if env:
        return env if Path(env).exists() else None
    found = shutil.which("redis-server")
    if found:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/local/bin/redis-server"):
        if Path(candidate).exists():
            return candidate
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:port`` with its data in ``directory``."""

    def __init__(
        self, binary: str, directory: str | Path, port: int | None = None, *, appendfsync: str = "everysec"
    ) -> None:
        self.binary = binary
        self.directory = Path(directory)
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {log}")
            if self._ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING on port {self.port} within {timeout}s")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL with ``kill=True``) and wait for the process to exit."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a wedged server
            proc.kill()
            proc.wait(timeout=5)

    def restart(self) -> RedisServer:
        self.stop()
        return self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="module", name="redis_server")
def redis_server_fixture() -> Iterator[RedisServer]:
    """A real redis-server for the module (skipped, with the reason, if no binary exists)."""
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary: install it (scripts/setup.sh does) or set REDIS_SERVER")
    with running_redis() as server:
        yield server


@contextmanager
def running_redis() -> Iterator[RedisServer]:
    """Start a server in a fresh temp dir; stop it and delete the dir afterwards."""
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("no redis-server binary (install redis-server or set REDIS_SERVER)")
    with tempfile.TemporaryDirectory(prefix="llmr-redis-") as tmp, RedisServer(binary, tmp) as server:
        yield server
