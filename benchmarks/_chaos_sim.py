"""The provider simulator in a child process, scripted through a pipe.

In the benchmark's own process the simulator's server thread competes with the systems under
test for one interpreter lock, and every streamed chunk costs both sides CPU: measured latencies
then say more about the harness than about the systems. A child process gives it its own core.
Times in its log are ``time.monotonic()`` values, which are system-wide on Linux, so they compare
with the parent's.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["Request", "SimulatorProcess"]

_START_TIMEOUT = 60.0  # seconds for the child to import and bind (the import alone takes a few)
_CALL_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Request:
    """One logged chat request, without its body: what the benchmark counts."""

    deployment: str
    started_at: float
    behavior: str
    status: int | None


def allow_loopback() -> None:
    """Keep proxies away from the simulator: LiteLLM's aiohttp transport honours HTTP_PROXY."""
    for key in ("NO_PROXY", "no_proxy"):
        current = [p for p in os.environ.get(key, "").split(",") if p]
        current += [h for h in ("127.0.0.1", "localhost") if h not in current]
        os.environ[key] = ",".join(current)


def _serve(conn: Connection) -> None:
    """The child: run a ProviderSimulator and answer the parent's calls until told to stop."""
    import llm_resilience_plugin  # noqa: F401  (offline LiteLLM settings first)
    from llm_resilience_plugin.testing import ProviderSimulator

    try:
        sim = ProviderSimulator().start()
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    try:
        conn.send(("ok", sim.port))
        while True:
            try:
                name, args = conn.recv()
            except EOFError:
                return
            if name == "stop":
                conn.send(("ok", None))
                return
            try:
                if name == "log":
                    wanted, since = args
                    result: Any = [
                        Request(r.deployment, r.started_at, r.behavior, r.status)
                        for r in sim.requests()
                        if r.deployment in wanted and r.started_at >= since
                    ]
                else:
                    result = getattr(sim, name)(*args)
                conn.send(("ok", result))
            except Exception as exc:  # the parent re-raises it
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        sim.stop()


class SimulatorProcess:
    """The subset of :class:`ProviderSimulator` the chaos benchmark uses, served by a child
    process (use as a context manager)."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), name="chaos-simulator", daemon=True)
        self._child = child
        self._lock = threading.Lock()
        self._port: int | None = None

    def __enter__(self) -> SimulatorProcess:
        allow_loopback()
        self._proc.start()
        self._child.close()
        if not self._conn.poll(_START_TIMEOUT):
            self._kill()
            raise RuntimeError(f"the simulator process did not start within {_START_TIMEOUT:g} s")
        try:
            status, port = self._conn.recv()
        except EOFError:
            status, port = "error", "it exited (see its traceback above)"
        if status != "ok":
            self._kill()
            raise RuntimeError(f"the simulator process did not start: {port}")
        self._port = int(port)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._ask("stop")
        except Exception:
            pass
        self._proc.join(10)
        self._kill()

    def _kill(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)

    def _ask(self, name: str, *args: Any) -> Any:
        with self._lock:
            self._conn.send((name, args))
            if not self._conn.poll(_CALL_TIMEOUT):
                raise RuntimeError(f"the simulator process did not answer {name} in {_CALL_TIMEOUT:g} s")
            status, result = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"simulator {name}: {result}")
        return result

    def api_base(self, deployment: str) -> str:
        """LiteLLM ``api_base`` for an ``openai/`` model served as ``deployment``."""
        if self._port is None or "/" in deployment or not deployment:
            raise ValueError(f"not started, or a bad deployment name: {deployment!r}")
        return f"http://127.0.0.1:{self._port}/{deployment}/v1"

    def set_default(self, deployment: str, behavior: Any) -> None:
        """What ``deployment`` does once its queue is empty."""
        self._ask("set_default", deployment, behavior)

    def script(self, deployment: str, *behaviors: Any) -> None:
        """Queue ``behaviors`` for ``deployment``; each request consumes one (FIFO)."""
        self._ask("script", deployment, *behaviors)

    def outage(self, deployment: str, seconds: float, behavior: Any = None) -> None:
        """Every request in the next ``seconds`` gets ``behavior`` (default: 503)."""
        self._ask("outage", deployment, seconds, behavior)

    def token_bucket(
        self, deployment: str, rate: float, burst: int, retry_after: float | None = None
    ) -> None:
        """Rate-limit ``deployment``: ``burst`` tokens, refilled at ``rate`` per second."""
        self._ask("token_bucket", deployment, rate, burst, retry_after)

    def reset(self) -> None:
        """Clear the log and every script, default, outage and bucket."""
        self._ask("reset")

    def log(self, deployments: set[str], since: float) -> list[Request]:
        """The requests to ``deployments`` that started at or after ``since`` (monotonic)."""
        return list(self._ask("log", deployments, since))
