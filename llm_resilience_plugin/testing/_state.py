"""The simulator's scripted state and request log, shared by the test thread and the server thread.

:class:`SimulatorState` holds each deployment's queue, default, outage, token bucket and context
window behind one lock, picks the behaviour for each request, and keeps the request log.
"""

from __future__ import annotations

import math
import random
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field

from llm_resilience_plugin.testing._faults import (
    OK,
    Behavior,
    Fault,
    check_count,
    check_seconds,
    resolve,
)
from llm_resilience_plugin.testing._messages import JSONDict

__all__ = ["MutableRecord", "RequestRecord", "SimulatorState", "check_deployment"]


@dataclass(frozen=True)
class RequestRecord:
    """A snapshot of one logged chat request."""

    deployment: str
    model: str
    stream: bool
    started_at: float
    finished_at: float | None
    behavior: str
    status: int | None
    body: JSONDict
    headers: dict[str, str]


@dataclass
class MutableRecord:
    """The live log entry of one chat request; the handler fills in status and finish time."""

    deployment: str
    model: str
    stream: bool
    started_at: float
    behavior: str
    body: JSONDict
    headers: dict[str, str]
    status: int | None = None
    finished_at: float | None = None
    # Response headers the deployment's rate limit adds (x-ratelimit-*), when it states them.
    limit_headers: dict[str, str] = field(default_factory=dict)

    def finish(self) -> None:
        """Stamp the finish time (once: later calls keep the first stamp)."""
        if self.finished_at is None:
            self.finished_at = time.monotonic()

    def snapshot(self) -> RequestRecord:
        """A frozen copy for the test thread."""
        return RequestRecord(
            deployment=self.deployment,
            model=self.model,
            stream=self.stream,
            started_at=self.started_at,
            finished_at=self.finished_at,
            behavior=self.behavior,
            status=self.status,
            body=self.body,
            headers=self.headers,
        )


@dataclass
class _Bucket:
    rate: float
    burst: float
    retry_after: float | None
    tokens: float
    updated: float

    def refill(self, now: float) -> None:
        self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def take(self, now: float, cost: float = 1.0) -> bool:
        self.refill(now)
        if self.tokens >= min(cost, self.burst):
            self.tokens -= cost
            return True
        return False

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.burst - self.tokens) / self.rate)


def _duration(seconds: float) -> str:
    """An ``x-ratelimit-reset-*`` value the way OpenAI writes it: ``120ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    return f"{int(seconds // 60)}m{int(seconds % 60)}s"


@dataclass
class _Limits:
    """A deployment's rpm/tpm limits, enforced as token buckets, stated in OpenAI's headers."""

    requests: _Bucket | None
    tokens: _Bucket | None
    retry_after: float | None
    headers: bool

    def admit(self, now: float, cost: float) -> bool:
        for b in (self.requests, self.tokens):
            if b is not None:
                b.refill(now)
        if self.requests is not None and self.requests.tokens < 1.0:
            return False
        if self.tokens is not None and self.tokens.tokens < min(cost, self.tokens.burst):
            return False
        if self.requests is not None:
            self.requests.tokens -= 1.0
        if self.tokens is not None:
            self.tokens.tokens -= cost
        return True

    def header_values(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, b in (("requests", self.requests), ("tokens", self.tokens)):
            if b is not None:
                out[f"x-ratelimit-limit-{name}"] = str(int(b.burst))
                out[f"x-ratelimit-remaining-{name}"] = str(max(0, int(b.tokens)))
                out[f"x-ratelimit-reset-{name}"] = _duration(b.reset_s())
        return out


@dataclass
class _DeploymentState:
    queue: deque[Behavior] = field(default_factory=deque)
    default: Behavior = OK
    outage_until: float = -math.inf
    outage_behavior: Behavior | None = None
    bucket: _Bucket | None = None
    limits: _Limits | None = None
    context_window: int | None = None
    rngs: dict[Behavior, random.Random] = field(default_factory=dict)


def _request_tokens(prompt_tokens: int, body: JSONDict | None) -> float:
    """What a request counts against a token limit: its prompt and its ``max_tokens`` (16 if unset)."""
    out = (body or {}).get("max_tokens") or (body or {}).get("max_completion_tokens")
    return float(prompt_tokens) + (float(out) if isinstance(out, int) and out > 0 else 16.0)


def check_deployment(deployment: str) -> str:
    """``deployment`` if it is a usable path segment (non-empty, no ``/``), else ValueError."""
    if not isinstance(deployment, str) or not deployment or "/" in deployment:
        raise ValueError(f"deployment must be a non-empty name without '/', got {deployment!r}")
    return deployment


class SimulatorState:
    """Per-deployment scripts and the request log, behind one lock (see ProviderSimulator's docs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, _DeploymentState] = {}
        self._log: list[MutableRecord] = []

    # -- scripting ---------------------------------------------------------------------------

    def _state(self, deployment: str) -> _DeploymentState:
        state = self._states.get(deployment)
        if state is None:
            state = self._states[deployment] = _DeploymentState()
        return state

    def script(self, deployment: str, *behaviors: Behavior) -> None:
        """Queue ``behaviors`` for ``deployment``; each request consumes one (FIFO)."""
        check_deployment(deployment)
        for behavior in behaviors:
            if not isinstance(behavior, Behavior):
                raise ValueError(f"behaviors must be Behavior values, got {behavior!r}")
        with self._lock:
            self._state(deployment).queue.extend(behaviors)

    def set_default(self, deployment: str, behavior: Behavior) -> None:
        """What ``deployment`` does once its queue is empty."""
        check_deployment(deployment)
        if not isinstance(behavior, Behavior):
            raise ValueError(f"behavior must be a Behavior, got {behavior!r}")
        with self._lock:
            self._state(deployment).default = behavior

    def outage(self, deployment: str, seconds: float, behavior: Behavior | None = None) -> None:
        """Every request in the next ``seconds`` gets ``behavior`` (default: 503)."""
        check_deployment(deployment)
        seconds = check_seconds("seconds", seconds)
        if behavior is None:
            behavior = Fault.server_error(503)
        if not isinstance(behavior, Behavior):
            raise ValueError(f"behavior must be a Behavior, got {behavior!r}")
        with self._lock:
            state = self._state(deployment)
            state.outage_until = time.monotonic() + seconds
            state.outage_behavior = behavior

    def token_bucket(
        self, deployment: str, rate: float, burst: int, retry_after: float | None = None
    ) -> None:
        """Rate-limit ``deployment``: ``burst`` tokens, refilled at ``rate`` per second."""
        check_deployment(deployment)
        rate = check_seconds("rate", rate)
        burst = check_count("burst", burst)
        if retry_after is not None:
            retry_after = check_seconds("retry_after", retry_after)
        with self._lock:
            self._state(deployment).bucket = _Bucket(
                rate=rate,
                burst=burst,
                retry_after=retry_after,
                tokens=float(burst),
                updated=time.monotonic(),
            )

    def rate_limit(
        self,
        deployment: str,
        rpm: float | None = None,
        tpm: float | None = None,
        *,
        burst_s: float = 1.0,
        retry_after: float | None = None,
        headers: bool = True,
    ) -> None:
        """Enforce ``rpm`` requests and ``tpm`` tokens (prompt + ``max_tokens``, else 16) a minute on
        ``deployment`` as buckets holding ``burst_s`` seconds' worth; above them a 429 (with
        ``Retry-After`` when given). ``headers``: every answer and 429 states the limits in
        OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``."""
        check_deployment(deployment)
        if rpm is None and tpm is None:
            raise ValueError("rate_limit needs rpm, tpm or both")
        burst_s = check_seconds("burst_s", burst_s)
        if retry_after is not None:
            retry_after = check_seconds("retry_after", retry_after)
        now = time.monotonic()

        def bucket(per_minute: float | None, name: str) -> _Bucket | None:
            if per_minute is None:
                return None
            rate = check_seconds(name, per_minute) / 60.0
            capacity = max(1.0, rate * burst_s)
            return _Bucket(rate=rate, burst=capacity, retry_after=retry_after, tokens=capacity, updated=now)

        with self._lock:
            limits = _Limits(bucket(rpm, "rpm"), bucket(tpm, "tpm"), retry_after, headers)
            self._state(deployment).limits = limits

    def set_context_window(self, deployment: str, tokens: int | None) -> None:
        """Reject prompts estimated above ``tokens`` with the context-length 400 (None: off)."""
        check_deployment(deployment)
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0):
            raise ValueError(f"tokens must be a positive integer or None, got {tokens!r}")
        with self._lock:
            self._state(deployment).context_window = tokens

    def deployments(self) -> list[str]:
        """The names of the deployments that have any scripted state, sorted."""
        with self._lock:
            return sorted(self._states)

    # -- log ---------------------------------------------------------------------------------

    def requests(self, deployment: str | None = None) -> list[RequestRecord]:
        """Snapshot of the request log (arrival order), optionally for one deployment."""
        with self._lock:
            return [r.snapshot() for r in self._log if deployment is None or r.deployment == deployment]

    def count(self, deployment: str | None = None) -> int:
        """Number of logged chat requests, optionally for one deployment."""
        with self._lock:
            if deployment is None:
                return len(self._log)
            return sum(1 for r in self._log if r.deployment == deployment)

    def clear_log(self) -> None:
        """Forget logged requests (scripts and settings are kept)."""
        with self._lock:
            self._log.clear()

    def reset(self) -> None:
        """Clear the log and every script, default, outage, bucket and context window."""
        with self._lock:
            self._log.clear()
            self._states.clear()

    def clear(self, deployment: str) -> None:
        """Forget one deployment's script, default, outage, bucket and window (healthy again)."""
        with self._lock:
            self._states.pop(deployment, None)

    def log(self, record: MutableRecord) -> None:
        """Append a request that gets no scripted behaviour (a malformed body)."""
        with self._lock:
            self._log.append(record)

    def admit(
        self,
        deployment: str,
        model: str,
        stream: bool,
        started: float,
        body: JSONDict,
        headers: dict[str, str],
        prompt_tokens: int,
    ) -> tuple[Behavior, MutableRecord]:
        """Pick the behaviour for one chat request and log it, atomically."""
        with self._lock:
            behavior, name = self._choose(deployment, prompt_tokens, started, body)
            record = MutableRecord(deployment, model, stream, started, name, body, headers)
            limits = self._states[deployment].limits if deployment in self._states else None
            if limits is not None and limits.headers:
                record.limit_headers = limits.header_values()
            self._log.append(record)
        return behavior, record

    def _choose(
        self, deployment: str, prompt_tokens: int, now: float, body: JSONDict | None = None
    ) -> tuple[Behavior, str]:
        """Pick the behaviour for one request (caller holds the lock)."""
        state = self._states.get(deployment)
        if state is None:
            return OK, "ok"
        prefix = ""
        if state.outage_behavior is not None and now < state.outage_until:
            behavior = state.outage_behavior
            prefix = "outage:"
        elif state.bucket is not None and not state.bucket.take(now):
            behavior = Fault.rate_limit(retry_after=state.bucket.retry_after)
            return behavior, "token_bucket:429"
        elif state.limits is not None and not state.limits.admit(now, _request_tokens(prompt_tokens, body)):
            return Fault.rate_limit(retry_after=state.limits.retry_after), "rate_limit:429"
        elif state.context_window is not None and prompt_tokens > state.context_window:
            return Fault.context_length(state.context_window), "context_window"
        elif state.queue:
            behavior = state.queue.popleft()
        else:
            behavior = state.default

        def draw(flaky: Behavior) -> float:
            rng = state.rngs.get(flaky)
            if rng is None:
                seed = flaky.seed if flaky.seed is not None else zlib.crc32(deployment.encode())
                rng = state.rngs[flaky] = random.Random(seed)
            return rng.random()

        behavior, name = resolve(behavior, body, draw)
        return behavior, prefix + name
