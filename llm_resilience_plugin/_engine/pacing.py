"""Pacing: a rate limit is demand to pace, not a failure to flee.

Each deployment may have a :class:`Pace`: a request bucket and a token bucket (GCRA-like token
buckets refilled continuously), a Retry-After hold, and a priority queue of the calls waiting for a
slot. Limits come from configuration (LiteLLM's ``rpm``/``tpm`` in ``litellm_params``, or the
policy's ``pacing.limits``) or are learned from the provider: its ``x-ratelimit-*`` /
``anthropic-ratelimit-*`` headers when it sends them, else its 429s (additive increase,
multiplicative decrease, AWS SDK adaptive-retry style). A deployment that never rate-limited us and
has no configured limit is not paced at all: healthy calls pay one attribute read.

The queue orders waiters by priority tier, FIFO within a tier. Each waiter sleeps until its own
estimated slot time (its place in the queue over the rate), so waiters wake in order, not as a
herd; the head grants itself and whoever is due, and a release (a shared bucket's change, a hold
that ends early) wakes the head. Cancellation removes the waiter. The buckets can be one fleet's:
:class:`SharedPace` (Redis, in ``shared_state``) answers "may this process take a slot now, and if
not, in how long" atomically for every worker.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from llm_resilience_plugin._engine.clock import Clock

# AIMD when the limit is learned from 429s alone (AWS SDK adaptive retry uses beta = 0.7).
DECREASE = 0.7
# Additive increase per second without a 429 while the pace binds: this share of the rate, at least
# one request a second.
INCREASE_SHARE = 0.05
# A 429 without Retry-After from a deployment whose limit is unknown holds it this long (seconds),
# and the requests it accepted in this window before the first refusal set its first pace.
LEARN_WINDOW = 1.0
# A learned limit is dropped after this long without a 429 and without the pace binding.
FORGET_AFTER = 60.0
# Slow start: a deployment's first requests (and a fallback's, once traffic fails over to it for
# a rate limit) go out at most SLOW_START_WINDOW at a time; each answer widens the window by one
# (it doubles per round trip, as TCP's does) and so does time while calls wait on it (doubling every
# SLOW_START_DOUBLING seconds, so a slow provider is not waited on for long), until
# SLOW_START_OPEN. A 429 ends it: the pace takes over. So a burst into an unknown limit does not
# send everything at once; a deployment that never rate-limits is past it after a few round trips.
SLOW_START_WINDOW = 32
SLOW_START_DOUBLING = 1.0
SLOW_START_OPEN = 1024
# The output tokens a request without max_tokens reserves against a token limit (corrected when
# its usage is known).
DEFAULT_OUTPUT_TOKENS = 256


class SharedPace(Protocol):
    """A fleet-wide bucket pair for one deployment (see ``shared_state.RedisPace``)."""

    def take(
        self, requests_per_s: float, burst: float, tokens_per_s: float | None, tburst: float, tokens: float
    ) -> float | None:
        """Take one request (and ``tokens``) now: 0.0 when taken, else the seconds until it would
        fit; None when the shared store cannot answer (the caller decides: local share or refuse)."""

    def refund(self, tokens: float) -> None:
        """Give back ``tokens`` reserved but not used (or take more, when negative)."""


@dataclass(slots=True)
class Limits:
    """A deployment's limits in requests and tokens per second (None: not limited that way),
    with where each comes from (``config``, ``headers``, ``learned``)."""

    requests_per_s: float | None = None
    request_burst: float = 1.0
    tokens_per_s: float | None = None
    token_burst: float = 0.0
    source: str = "none"


@dataclass(order=True, slots=True)
class Waiter:
    """One call waiting for a slot: ordered by tier rank, then arrival."""

    rank: int
    seq: int
    tokens: float = field(compare=False, default=0.0)
    granted: bool = field(compare=False, default=False)
    gone: bool = field(compare=False, default=False)
    wake: Any = field(compare=False, default=None)  # an asyncio future or a threading.Event


@dataclass(slots=True)
class Grant:
    """A slot taken: the tokens reserved (settled when usage is known) and how long it waited."""

    deployment_id: str
    tokens: float
    waited: float
    counted: bool = True  # holds an in-flight place until :meth:`Pace.ended`


_SEQ = itertools.count()
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration(value: Any) -> float | None:
    """Seconds in an ``x-ratelimit-reset-*`` value: ``"1s"``, ``"120ms"``, ``"6m0s"``, ``"0.5"``."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if not text:
        return None
    try:
        seconds = float(text)
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    except ValueError:
        pass
    total, matched = 0.0, 0
    for number, unit in _DURATION.findall(text[:32]):
        matched += 1
        total += float(number) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    return total if matched else None


def _reset_seconds(value: Any, now_wall: float) -> float | None:
    """A reset that is a duration (OpenAI, Azure) or an RFC 3339 time (Anthropic)."""
    seconds = parse_duration(value)
    if seconds is not None:
        return seconds
    text = str(value).strip()
    if "T" in text[:32]:
        from datetime import datetime

        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        return max(0.0, when.timestamp() - now_wall)
    return None


@dataclass(frozen=True, slots=True)
class HeaderLimit:
    """What a provider's rate-limit headers said of one dimension (requests or tokens)."""

    limit: float
    remaining: float
    reset_s: float | None

    def rate(self) -> float | None:
        """The refill rate these values imply: what was used comes back over the reset time."""
        if self.limit <= 0:
            return None
        used = self.limit - self.remaining
        if self.reset_s and self.reset_s > 0 and used > 0:
            return used / self.reset_s
        return None


_PREFIXES = ("", "llm_provider-")


def _get(headers: Mapping[str, Any], name: str) -> Any:
    for prefix in _PREFIXES:
        value = headers.get(prefix + name)
        if value is not None:
            return value
    return None


def _number(value: Any) -> float | None:
    try:
        n = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return n if math.isfinite(n) and n >= 0 else None


def header_limits(
    headers: Mapping[str, Any] | None, now_wall: float | None = None
) -> tuple[HeaderLimit | None, HeaderLimit | None]:
    """(requests, tokens) from OpenAI/Azure ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``
    or Anthropic ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` headers (also
    with LiteLLM's ``llm_provider-`` prefix); None for a dimension they do not give."""
    if not headers:
        return None, None
    try:
        lowered = {str(k).lower(): v for k, v in dict(headers).items()}
    except (TypeError, ValueError):
        return None, None
    now = time.time() if now_wall is None else now_wall
    out: list[HeaderLimit | None] = []
    for dim in ("requests", "tokens"):
        forms = (
            (f"x-ratelimit-limit-{dim}", f"x-ratelimit-remaining-{dim}", f"x-ratelimit-reset-{dim}"),
            (
                f"anthropic-ratelimit-{dim}-limit",
                f"anthropic-ratelimit-{dim}-remaining",
                f"anthropic-ratelimit-{dim}-reset",
            ),
        )
        found = None
        for limit_key, remaining_key, reset_key in forms:
            limit = _number(_get(lowered, limit_key))
            remaining = _number(_get(lowered, remaining_key))
            if limit is None or remaining is None:
                continue
            reset_value = _get(lowered, reset_key)
            found = HeaderLimit(
                limit,
                min(limit, remaining),
                _reset_seconds(reset_value, now) if reset_value is not None else None,
            )
            break
        out.append(found)
    return out[0], out[1]


class Pace:
    """One deployment's pace: buckets for requests and tokens, a hold, a priority queue."""

    def __init__(
        self,
        deployment_id: str,
        clock: Clock,
        *,
        configured: Limits | None = None,
        learn: bool = True,
        headroom: float = 1.0,
        shared: SharedPace | None = None,
        fail_closed: bool = False,
    ) -> None:
        self.deployment_id = deployment_id
        self.clock = clock
        self.learn = learn
        self.headroom = headroom
        self.shared = shared
        self.fail_closed = fail_closed
        self._lock = threading.Lock()
        self.configured = configured
        self.limits = Limits()
        if configured is not None:
            self.limits = Limits(
                configured.requests_per_s * headroom if configured.requests_per_s else None,
                configured.request_burst,
                configured.tokens_per_s * headroom if configured.tokens_per_s else None,
                configured.token_burst,
                "config",
            )
        now = clock.monotonic()
        self._level = self.limits.request_burst
        self._tlevel = self.limits.token_burst
        self._updated = now
        self._hold_until = 0.0
        self._queue: list[Waiter] = []
        self._last_429 = -math.inf
        self._last_decrease = -math.inf
        self._last_increase = now
        self._last_bound = -math.inf  # when the pace last made a call wait
        # Requests sent recently: (sent at, refused?) - the first pace learned from 429s alone.
        self._sent: deque[tuple[float, bool]] = deque(maxlen=4096)
        self._learned_from: tuple[float, float] | None = None  # the window the first pace counted
        self.inflight = 0  # requests sent through admission and not ended
        self._ss_start: float | None = None  # slow start began (None: not started; see above)
        self._ss_over = False
        self._ss_mark: float | None = None  # since when calls wait on the slow-start window
        self._ss_acks = 0  # answers during slow start (each widens the window by one)
        self.granted = 0
        self.refused = 0  # 429s seen
        self.waited_s = 0.0

    # -- reading -----------------------------------------------------------------------------

    @property
    def limited(self) -> bool:
        """Does this pace make calls wait (a limit known, or a hold running)? Unpaced: never."""
        lim = self.limits
        return (
            lim.requests_per_s is not None
            or lim.tokens_per_s is not None
            or (self._ss_start is not None and not self._ss_over)
            or self._hold_until > self.clock.monotonic()
            or bool(self._queue)
        )

    def _window(self, now: float) -> float:
        """How many requests may be in flight during slow start (inf once it is over)."""
        if self._ss_over:
            return math.inf
        if self._ss_start is None:
            self._ss_start = 0.0  # seconds it has bound so far (its clock runs only while it binds)
        bound = self._ss_start + (now - self._ss_mark if self._ss_mark is not None else 0.0)
        w = (SLOW_START_WINDOW + self._ss_acks) * 2 ** (bound / SLOW_START_DOUBLING)
        if w >= SLOW_START_OPEN:
            self._ss_over = True
            return math.inf
        return w

    def end_slow_start(self) -> None:
        """No slow start for this deployment (pacing off, or a known limit paces it instead)."""
        self._ss_over = True

    def restart_slow_start(self) -> None:
        """Traffic is about to move here for a rate limit elsewhere: ramp up again, unless a
        limit is known or the deployment was in use lately."""
        if self._ss_over and self.limits.requests_per_s is None and self.inflight == 0:
            with self._lock:
                self._ss_over, self._ss_start, self._ss_mark, self._ss_acks = False, None, None, 0

    def ended(self, grant: Grant | None) -> None:
        """An admitted request ended (answered, failed, cancelled): its in-flight place frees."""
        if grant is None or not grant.counted:
            return
        grant.counted = False
        now = self.clock.monotonic()
        with self._lock:
            self.inflight = max(0, self.inflight - 1)
            if self._queue:
                self._grant_due(now)

    @property
    def exact(self) -> bool:
        """Is the pace a stated limit (configured, or the provider's headers), not a guess?"""
        return self.limits.source in ("config", "headers")

    @property
    def admits(self) -> bool:
        """Must an attempt to this deployment go through admission: paced, or not yet past its
        slow start (a deployment never sent to included)?"""
        return not self._ss_over or self.limited

    @property
    def queued(self) -> int:
        return len(self._queue)

    def snapshot(self) -> dict[str, Any]:
        """The effective limits and where they come from, the queue and the counters."""
        lim = self.limits
        now = self.clock.monotonic()
        with self._lock:
            self._refill(now)
            return {
                "deployment_id": self.deployment_id,
                "source": lim.source,
                "rpm": round(lim.requests_per_s * 60, 3) if lim.requests_per_s else None,
                "tpm": round(lim.tokens_per_s * 60, 1) if lim.tokens_per_s else None,
                "request_burst": lim.request_burst,
                "token_burst": lim.token_burst,
                "queued": len(self._queue),
                "held_for_s": round(max(0.0, self._hold_until - now), 3),
                "granted": self.granted,
                "provider_429s": self.refused,
                "waited_s": round(self.waited_s, 3),
            }

    # -- buckets (lock held) -----------------------------------------------------------------

    def _refill(self, now: float) -> None:
        lim = self.limits
        dt = now - self._updated
        if dt <= 0:
            return
        self._updated = now
        if lim.requests_per_s is not None:
            self._level = min(lim.request_burst, self._level + dt * lim.requests_per_s)
        if lim.tokens_per_s is not None:
            self._tlevel = min(lim.token_burst, self._tlevel + dt * lim.tokens_per_s)
        if self._queue and lim.requests_per_s is not None and now - self._last_increase >= 1.0:
            # Additive increase while the pace binds and no 429 came for a second, up to the
            # configured limit (a limit the headers state is exact: it is not probed).
            cap = self._cap()
            if now - self._last_429 >= 1.0 and lim.source != "headers" and lim.requests_per_s < cap:
                steps = int(now - self._last_increase)
                step = max(1.0, INCREASE_SHARE * lim.requests_per_s)
                if lim.requests_per_s >= 0.9 * self._rate_at_429:
                    step *= 0.1  # near the rate the last 429 came at: probe, do not push (CUBIC's plateau)
                lim.requests_per_s = min(cap, lim.requests_per_s + steps * step)
            self._last_increase = now

    def _cap(self) -> float:
        """The most requests a second the pace may reach: the configured limit, else none."""
        c = self.configured
        return c.requests_per_s * self.headroom if c is not None and c.requests_per_s else math.inf

    def _fits(self, tokens: float) -> bool:
        lim = self.limits
        if not self._ss_over and self.inflight >= self._window(self.clock.monotonic()):
            return False
        if lim.requests_per_s is not None and self._level < 1.0:
            return False
        if lim.tokens_per_s is not None and tokens > 0:
            # A request larger than the whole bucket goes when the bucket is full (never starves).
            need = min(tokens, lim.token_burst)
            if self._tlevel < need:
                return False
        return True

    def _take(self, tokens: float) -> None:
        lim = self.limits
        self.inflight += 1
        if lim.requests_per_s is not None:
            self._level -= 1.0
        if lim.tokens_per_s is not None:
            self._tlevel -= tokens

    def _wait_for(self, ahead_requests: float, ahead_tokens: float, now: float) -> float:
        """Seconds until ``ahead_requests`` requests and ``ahead_tokens`` tokens fit (lock held)."""
        lim = self.limits
        hold = max(0.0, self._hold_until - now)
        wait = hold
        if not self._ss_over and self._ss_start is not None:
            need = self.inflight + ahead_requests
            if need > self._window(now) and not self._ss_over:
                wait = max(
                    wait, self._ss_start + SLOW_START_DOUBLING * math.log2(need / SLOW_START_WINDOW) - now
                )
        if lim.requests_per_s:
            wait = max(wait, (ahead_requests - self._level) / lim.requests_per_s)
        elif self._pending_learn is not None:  # first pace not known yet: what it is likely to be
            at, span = self._pending_learn
            accepted = sum(1 for t, refused in self._sent if at - LEARN_WINDOW <= t <= at and not refused)
            rate = max(1.0, accepted) / span
            wait = hold + max(0.0, ahead_requests - max(1.0, accepted)) / rate
        if lim.tokens_per_s and ahead_tokens > 0:
            need = ahead_tokens - self._tlevel
            wait = max(wait, need / lim.tokens_per_s)
        return max(0.0, wait)

    def _ahead(self, rank: int, seq: int) -> tuple[float, float]:
        """Requests and tokens queued ahead of (rank, seq), itself included."""
        n, toks = 0.0, 0.0
        for w in self._queue:
            if not w.gone and (w.rank, w.seq) <= (rank, seq):
                n += 1.0
                toks += min(w.tokens, self.limits.token_burst) if self.limits.tokens_per_s else 0.0
        return n, toks

    def _track_slow_start(self, now: float) -> None:
        """Run the slow-start clock while calls wait, stop it when none do (lock held)."""
        if self._ss_over:
            return
        if self._queue and self._ss_mark is None:
            self._ss_mark = now
        elif not self._queue and self._ss_mark is not None:
            self._ss_start = (self._ss_start or 0.0) + now - self._ss_mark
            self._ss_mark = None

    def _grant_due(self, now: float) -> None:
        """Grant the queue's head, and each next one, while a slot is free (lock held)."""
        try:
            self._grant_heads(now)
        finally:
            self._track_slow_start(now)

    def _grant_heads(self, now: float) -> None:
        if self._hold_until > now:
            return
        q = self._queue
        while q:
            head = q[0]
            if head.gone:
                heapq.heappop(q)
                continue
            if not self._fits(head.tokens) or not self._shared_take(head.tokens):
                return
            heapq.heappop(q)
            self._take(head.tokens)
            head.granted = True
            _signal(head.wake)

    def _shared_take(self, tokens: float) -> bool:
        """The fleet's slot too, when the buckets are shared (local buckets already allow it)."""
        shared = self.shared
        if shared is None:
            return True
        lim = self.limits
        if lim.requests_per_s is None and lim.tokens_per_s is None:
            return True
        answer = shared.take(
            lim.requests_per_s or 0.0, lim.request_burst, lim.tokens_per_s, lim.token_burst, tokens
        )
        if answer is None:  # the store cannot say: the local share decides, unless fail-closed
            return not self.fail_closed
        if answer > 0:
            self._hold_until = max(self._hold_until, self.clock.monotonic() + min(answer, 5.0))
            return False
        return True

    # -- admission ---------------------------------------------------------------------------

    def try_take(self, tokens: float = 0.0) -> bool:
        """Take a slot at once if nobody waits and one is free (no queue, no sleep)."""
        now = self.clock.monotonic()
        with self._lock:
            self._refill(now)
            if self._queue or self._hold_until > now or not self._fits(tokens):
                return False
            if not self._shared_take(tokens):
                return False
            self._take(tokens)
            self.granted += 1
            return True

    def estimate(self, rank: int, tokens: float = 0.0) -> float:
        """Seconds a call of tier ``rank`` would wait if it joined the queue now."""
        now = self.clock.monotonic()
        with self._lock:
            self._refill(now)
            n, toks = self._ahead(rank, math.inf)  # type: ignore[arg-type]
            tb = self.limits.token_burst
            mine = min(tokens, tb) if self.limits.tokens_per_s else 0.0
            return self._wait_for(n + 1.0, toks + mine, now)

    def join(self, rank: int, tokens: float = 0.0) -> Waiter:
        """Queue a waiter (it is granted by :meth:`wait_async` / :meth:`wait_blocking`)."""
        w = Waiter(rank, next(_SEQ), tokens)
        with self._lock:
            heapq.heappush(self._queue, w)
            self._track_slow_start(self.clock.monotonic())
        return w

    def leave(self, w: Waiter) -> None:
        """``w`` stops waiting (cancelled, gave up); a slot it was granted is given back."""
        now = self.clock.monotonic()
        with self._lock:
            if w.granted and not w.gone:
                lim = self.limits
                if lim.requests_per_s is not None:
                    self._level = min(lim.request_burst, self._level + 1.0)
                if lim.tokens_per_s is not None:
                    self._tlevel = min(lim.token_burst, self._tlevel + w.tokens)
                if self.shared is not None:
                    self.shared.refund(w.tokens)
            w.gone = True
            self._queue = [x for x in self._queue if not x.gone]
            heapq.heapify(self._queue)
            self._grant_due(now)

    def _next_wait(self, w: Waiter, now: float) -> float | None:
        """Grant what is due; None when ``w`` got its slot, else seconds until its turn (lock held)."""
        self._settle(now)
        self._refill(now)
        self._grant_due(now)
        if w.granted:
            return None
        n, toks = self._ahead(w.rank, w.seq)
        self._last_bound = now
        return max(0.001, self._wait_for(n, toks, now))

    async def wait_async(self, w: Waiter, give_up_at: float, leave_at: float = math.inf) -> str:
        """Wait (async) for ``w``'s slot: ``"granted"``; ``"deadline"`` when it would come after
        ``give_up_at`` (monotonic); ``"leave"`` when it would come after ``leave_at`` (the call
        has a fallback with headroom to go to instead)."""
        loop = asyncio.get_running_loop()
        real = type(self.clock).sleep is Clock.sleep
        started = self.clock.monotonic()
        try:
            while True:
                now = self.clock.monotonic()
                with self._lock:
                    wait = self._next_wait(w, now)
                    if wait is None:
                        self._done(w, now - started)
                        return "granted"
                    # A learned pace is a guess still converging: only a stated limit's estimate
                    # is trusted to give up early; a learned one waits until the time is out.
                    due = now + wait if self.exact else now
                    if due > give_up_at or due > leave_at:
                        w.gone = True
                        return "deadline" if due > give_up_at else "leave"
                    fut: asyncio.Future[None] = loop.create_future()
                    w.wake = fut
                wait = min(wait, max(0.0, give_up_at - now) + 0.001)
                if real:
                    try:
                        await asyncio.wait_for(fut, wait)
                    except TimeoutError:
                        pass
                else:
                    await self.clock.sleep(wait)
        except BaseException:
            self.leave(w)
            raise
        finally:
            w.wake = None
            if w.gone:
                self.leave(w)

    def wait_blocking(self, w: Waiter, give_up_at: float, leave_at: float = math.inf) -> str:
        """The blocking twin of :meth:`wait_async`, for a caller on its own thread."""
        from llm_resilience_plugin._engine.retry import sleep_blocking

        real = type(self.clock).sleep is Clock.sleep
        started = self.clock.monotonic()
        try:
            while True:
                now = self.clock.monotonic()
                with self._lock:
                    wait = self._next_wait(w, now)
                    if wait is None:
                        self._done(w, now - started)
                        return "granted"
                    # A learned pace is a guess still converging: only a stated limit's estimate
                    # is trusted to give up early; a learned one waits until the time is out.
                    due = now + wait if self.exact else now
                    if due > give_up_at or due > leave_at:
                        w.gone = True
                        return "deadline" if due > give_up_at else "leave"
                    event = threading.Event()
                    w.wake = event
                wait = min(wait, max(0.0, give_up_at - now) + 0.001)
                if real:
                    event.wait(wait)
                else:
                    sleep_blocking(self.clock, wait)
        except BaseException:
            self.leave(w)
            raise
        finally:
            w.wake = None
            if w.gone:
                self.leave(w)

    def _done(self, w: Waiter, waited: float) -> None:
        self.granted += 1
        self.waited_s += waited

    # -- what the provider said --------------------------------------------------------------

    def answered_at(self, sent_at: float) -> None:
        """A request sent at ``sent_at`` (monotonic) was accepted: the first pace counts these
        (one that ends after the pace was set raises it to what was really accepted)."""
        self._sent.append((sent_at, False))
        if not self._ss_over:
            self._ss_acks += 1
        learned = self._learned_from
        if learned is not None and learned[0] - LEARN_WINDOW <= sent_at <= learned[0]:
            with self._lock:
                at, hold = learned
                lim = self.limits
                if lim.source != "learned" or lim.requests_per_s is None:
                    return
                accepted = sum(1 for t, refused in self._sent if at - LEARN_WINDOW <= t <= at and not refused)
                if accepted / hold > lim.requests_per_s and self._last_decrease <= self._learned_at:
                    lim.requests_per_s = accepted / hold
                    lim.request_burst = max(lim.request_burst, min(float(accepted), lim.requests_per_s))

    def wants_headers(self, headers: Mapping[str, Any] | None) -> bool:
        """Are an answer's rate-limit headers worth adopting: this deployment is paced already,
        or they say less than a tenth of its limit is left (pace before the first 429)?"""
        if not headers or not self.learn:
            return False
        if self.limited:
            return True
        req, tok = header_limits(headers)
        return any(h is not None and h.limit > 0 and h.remaining < 0.1 * h.limit for h in (req, tok))

    def on_answer(
        self, headers: Mapping[str, Any] | None, tokens_reserved: float, tokens_used: float | None
    ) -> bool:
        """An answer: settle its token reservation, adopt the limits its headers give; True when
        the deployment is paced afterwards."""
        now = self.clock.monotonic()
        with self._lock:
            if tokens_used is not None and self.limits.tokens_per_s is not None:
                delta = tokens_reserved - tokens_used
                self._tlevel = min(self.limits.token_burst, self._tlevel + delta)
                if self.shared is not None and delta:
                    self.shared.refund(delta)
            if headers:
                self._adopt_headers(headers, now)
            self._grant_due(now)
        return self.limited

    def give_back(self, grant: Grant) -> None:
        """An attempt that took a slot sent nothing: the slot and its tokens come back."""
        now = self.clock.monotonic()
        with self._lock:
            if grant.counted:
                grant.counted = False
                self.inflight = max(0, self.inflight - 1)
            lim = self.limits
            if lim.requests_per_s is not None:
                self._level = min(lim.request_burst, self._level + 1.0)
            if lim.tokens_per_s is not None and grant.tokens:
                self._tlevel = min(lim.token_burst, self._tlevel + grant.tokens)
            if self.shared is not None and grant.tokens:
                self.shared.refund(grant.tokens)
            self._grant_due(now)

    def on_rate_limited(
        self,
        retry_after: float | None,
        headers: Mapping[str, Any] | None,
        latency: float = 0.0,
        grant: Grant | None = None,
    ) -> None:
        """A 429 for a request sent ``latency`` seconds ago: hold for its Retry-After, and set or
        lower the pace (from its headers, else additive-increase/multiplicative-decrease)."""
        now = self.clock.monotonic()
        with self._lock:
            self.refused += 1
            self._ss_over = True  # the limit is found: the pace takes over from slow start
            self._sent.append((now - latency, True))
            self._last_429 = now
            if grant is not None and grant.tokens and self.limits.tokens_per_s is not None:
                self._tlevel = min(self.limits.token_burst, self._tlevel + grant.tokens)  # not counted
            hold = retry_after
            adopted = self._adopt_headers(headers, now) if headers else False
            lim = self.limits
            if not adopted and self.learn:
                if lim.requests_per_s is None:
                    if self._pending_learn is None:
                        # The first pace: what the deployment accepted in the window before this
                        # refusal, counted when the hold ends (once the wave's refusals are in).
                        self._pending_learn = (now - latency, max(hold or LEARN_WINDOW, LEARN_WINDOW))
                    lim.source = "learned"
                    if hold is None:
                        hold = LEARN_WINDOW
                elif now - self._last_decrease >= min(1.0, 1.0 / lim.requests_per_s):
                    self._rate_at_429 = lim.requests_per_s
                    lim.requests_per_s = max(1.0 / 60.0, lim.requests_per_s * DECREASE)
                    self._last_decrease = now
            if hold is None and lim.requests_per_s:
                hold = 1.0 / lim.requests_per_s
            if hold:
                self._hold_until = max(self._hold_until, now + hold)
            self._level = min(self._level, 0.0)
            self._last_increase = now

    _pending_learn: tuple[float, float] | None = None
    _learned_at = 0.0
    _rate_at_429 = math.inf  # the pace a 429 last lowered (the increase slows near it)

    def settle_learning(self) -> None:
        """Turn a pending first estimate into a pace once its hold has ended."""
        if self._pending_learn is None:
            return
        with self._lock:
            self._settle(self.clock.monotonic())

    def _settle(self, now: float) -> None:
        """:meth:`settle_learning` with the lock held: the first pace is the requests the
        deployment accepted in the window before its first refusal, over the hold it asked for."""
        pending = self._pending_learn
        if pending is None or now < self._hold_until:
            return
        at, hold = pending
        self._pending_learn = None
        lim = self.limits
        if lim.requests_per_s is not None:
            return
        start = at - LEARN_WINDOW
        accepted = sum(1 for t, refused in self._sent if start <= t <= at and not refused)
        lim.requests_per_s = max(1.0 / 60.0, accepted / hold) if accepted else 1.0 / hold
        self._rate_at_429 = lim.requests_per_s  # what it accepted is as high as it is known to go
        lim.request_burst = max(1.0, min(float(accepted), lim.requests_per_s))
        self._level = lim.request_burst  # the provider refilled while it held us off
        self._learned_from, self._learned_at = pending, now
        self._updated = now
        self._last_increase = now
        self._last_decrease = now

    def _adopt_headers(self, headers: Mapping[str, Any], now: float) -> bool:
        """Set the limits the provider's headers state (configured limits cap them); lock held."""
        if not self.learn and self.configured is None:
            return False
        req, tok = header_limits(headers)
        if req is None and tok is None:
            return False
        lim = self.limits
        cfg = self.configured
        changed = False
        if req is not None:
            rate = req.rate()
            if rate is None and req.remaining < req.limit:
                rate = req.limit / 60.0
            if rate is not None and self.learn:
                if cfg is not None and cfg.requests_per_s:
                    rate = min(rate, cfg.requests_per_s)
                lim.requests_per_s = rate * self.headroom
                lim.request_burst = max(1.0, req.limit)
                changed = True
            if lim.requests_per_s is not None:
                self._level = min(self._level, req.remaining)
        if tok is not None:
            rate = tok.rate()
            if rate is not None and self.learn:
                if cfg is not None and cfg.tokens_per_s:
                    rate = min(rate, cfg.tokens_per_s)
                lim.tokens_per_s = rate * self.headroom
                lim.token_burst = max(1.0, tok.limit)
                changed = True
            if lim.tokens_per_s is not None:
                self._tlevel = min(self._tlevel, tok.remaining)
        if changed and lim.source != "config":
            lim.source = "headers"
        self._pending_learn = None
        return changed

    def forget_if_idle(self) -> None:
        """Drop a learned limit after a quiet minute (no 429, the pace not binding)."""
        lim = self.limits
        if lim.source not in ("learned", "headers") or self._queue:
            return
        now = self.clock.monotonic()
        if now - self._last_429 > FORGET_AFTER and now - self._last_bound > FORGET_AFTER:
            with self._lock:
                if self._queue:
                    return
                if self.configured is not None:
                    c = self.configured
                    self.limits = Limits(
                        c.requests_per_s * self.headroom if c.requests_per_s else None,
                        c.request_burst,
                        c.tokens_per_s * self.headroom if c.tokens_per_s else None,
                        c.token_burst,
                        "config",
                    )
                else:
                    self.limits = Limits()


def _signal(wake: Any) -> None:
    """Wake a waiter from any thread."""
    if wake is None:
        return
    if isinstance(wake, threading.Event):
        wake.set()
        return
    fut: asyncio.Future[None] = wake

    def done() -> None:
        if not fut.done():
            fut.set_result(None)

    try:
        fut.get_loop().call_soon_threadsafe(done)
    except RuntimeError:
        pass


def configured_limits(params: Mapping[str, Any], override: Mapping[str, Any] | None = None) -> Limits | None:
    """A deployment's configured limits: the policy's ``pacing.limits`` entry over LiteLLM's
    ``rpm``/``tpm`` in ``litellm_params`` (per minute; bursts default to one second's worth)."""
    rpm = _positive((override or {}).get("rpm")) or _positive(params.get("rpm"))
    tpm = _positive((override or {}).get("tpm")) or _positive(params.get("tpm"))
    if rpm is None and tpm is None:
        return None
    rps = rpm / 60.0 if rpm else None
    tps = tpm / 60.0 if tpm else None
    burst = _positive((override or {}).get("burst"))
    return Limits(
        rps,
        burst or (max(1.0, rps) if rps else 1.0),
        tps,
        # The token bucket holds as many seconds of tokens as the request bucket does of requests.
        max(1.0, tps or 0.0) * ((burst / rps) if burst and rps else 1.0) if tps else 0.0,
        "config",
    )


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < math.inf else None
