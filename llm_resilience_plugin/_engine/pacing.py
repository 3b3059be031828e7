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

import heapq
import itertools
import math
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin._engine.concurrency import Gradient
from llm_resilience_plugin._engine.holds import resolve
from llm_resilience_plugin._engine.limits import Limits
from llm_resilience_plugin._engine.pace_learning import (
    INCREASE_SHARE,
    LEARN_WINDOW,
    SLOW_START_DOUBLING,
    SLOW_START_WINDOW,
    PaceLearning,
)

# The output tokens a request without max_tokens reserves against a token limit (corrected when
# its usage is known).
DEFAULT_OUTPUT_TOKENS = 256
# Priority across a fleet: a shared bucket lets a call of tier rank r (of n) take a slot only while
# FLEET_RESERVE * r / (n - 1) of the bucket's burst stays behind it, so the lower tiers leave the
# last slots to the higher ones on every worker. The bucket still refills at the whole rate and the
# lower tiers use all of it once they wait (they hover at their reserve): it costs no throughput,
# only the lower tiers' first burst. (Within one process the queue orders the tiers.)
FLEET_RESERVE = 0.5
# A waiter looks at its place at least this often (seconds), whatever its estimate said: an
# estimate made at a pace that changed since (a limit learned, a hold lifted) is not slept out.
MAX_NAP = 2.0


class SharedPace(Protocol):
    """A fleet-wide bucket pair for one deployment (see ``shared_state.RedisPace``)."""

    def take(
        self,
        requests_per_s: float,
        burst: float,
        tokens_per_s: float | None,
        tburst: float,
        tokens: float,
        reserve: float = 0.0,
    ) -> float | None:
        """Take one request (and ``tokens``) now, leaving ``reserve`` (a share of each burst) for
        higher tiers: 0.0 when taken, else the seconds until it would fit; None when the shared
        store cannot answer (the caller decides: local share or refuse)."""

    def refund(self, tokens: float) -> None:
        """Give back ``tokens`` reserved but not used (or take more, when negative)."""


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
    serial: int = 0  # the pace's grant count when this one was granted (see adopt_headers)


_SEQ = itertools.count()


class Pace(PaceLearning):
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
        self.lock = threading.Lock()
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
        # Half full, as a fleet's: the provider's remainder is unknown, a first burst arrives late.
        self._level, self._tlevel = max(1.0, self.limits.request_burst / 2), self.limits.token_burst / 2
        self._updated = now
        self._hold_until = 0.0
        # The shared bucket refused a call of tier rank ``_shared_rank``: that tier and lower ones
        # do not ask it again before ``_shared_until`` (a higher tier may: its reserve is smaller).
        self._shared_until = 0.0
        self._shared_rank = math.inf
        self.tiers = 4  # the policy's tier count (the fleet reserve's scale; set by Paces)
        self.concurrency: Gradient | None = None  # an adaptive in-flight limit (set by Paces)
        self.waiting: list[Waiter] = []
        self._planned_head: Waiter | None = None  # the head last woken to plan its own slot
        self._last_429 = -math.inf
        self._last_decrease = -math.inf
        self._last_increase = now
        self.last_bound = -math.inf  # when the pace last made a call wait
        # Requests sent recently: (sent at, refused?) - the first pace learned from 429s alone.
        self.sends: deque[tuple[float, bool]] = deque(maxlen=4096)
        self._learned_from: tuple[float, float] | None = None  # the window the first pace counted
        self.inflight = 0  # requests sent through admission and not ended
        self._ss_start: float | None = None  # slow start began (None: not started; see above)
        # Under a fake clock (tests of retry timing) waiting for answers would advance time: no
        # slow start there; its own tests run on the real clock.
        self._ss_over = type(clock).sleep is not Clock.sleep
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
            or self.concurrency is not None
            or (self._ss_start is not None and not self._ss_over)
            or max(self._hold_until, self._shared_until) > self.clock.monotonic()
            or bool(self.waiting)
        )

    def ended(self, grant: Grant | None) -> None:
        """An admitted request ended (answered, failed, cancelled): its in-flight place frees."""
        if grant is None or not grant.counted:
            return
        grant.counted = False
        now = self.clock.monotonic()
        with self.lock:
            self.inflight = max(0, self.inflight - 1)
            if self.waiting:
                self._grant_due(now)

    @property
    def exact(self) -> bool:
        """Is the pace a stated limit (configured, or the provider's headers), not a guess? (A
        wait for an in-flight place is a guess: it depends on when answers come.)"""
        c = self.concurrency
        return self.limits.source in ("config", "headers") and (c is None or c.allows(self.inflight))

    @property
    def admits(self) -> bool:
        """Must an attempt to this deployment go through admission: paced, or not yet past its
        slow start (a deployment never sent to included)?"""
        return not self._ss_over or self.limited

    @property
    def queued(self) -> int:
        return len(self.waiting)

    def snapshot(self) -> dict[str, Any]:
        """The effective limits and where they come from, the queue and the counters."""
        lim = self.limits
        now = self.clock.monotonic()
        with self.lock:
            self._refill(now)
            return {
                "deployment_id": self.deployment_id,
                "source": lim.source,
                "rpm": round(lim.requests_per_s * 60, 3) if lim.requests_per_s else None,
                "tpm": round(lim.tokens_per_s * 60, 1) if lim.tokens_per_s else None,
                "request_burst": lim.request_burst,
                "token_burst": lim.token_burst,
                "queued": len(self.waiting),
                "held_for_s": round(max(0.0, self._hold_until - now), 3),
                "granted": self.granted,
                "provider_429s": self.refused,
                "waited_s": round(self.waited_s, 3),
                "in_flight": self.inflight,
                "concurrency": self.concurrency.snapshot() if self.concurrency is not None else None,
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
        if self.waiting and lim.requests_per_s is not None and now - self._last_increase >= 1.0:
            # Additive increase while the pace binds and no 429 came for a second, up to the
            # configured limit (a limit the headers state is exact: it is not probed).
            cap = self._cap()
            if now - self._last_429 >= 1.0 and lim.source != "headers" and lim.requests_per_s < cap:
                steps = int(now - self._last_increase)
                step = max(1.0, INCREASE_SHARE * lim.requests_per_s)
                if self.probing:  # a guessed first pace: double until a 429 says where the limit is
                    step = lim.requests_per_s * (2.0**steps - 1.0) / steps
                elif lim.requests_per_s >= 0.9 * self.rate_at_429:
                    step *= 0.1  # near the rate the last 429 came at: probe, do not push (CUBIC's plateau)
                lim.requests_per_s = min(cap, lim.requests_per_s + steps * step)
            self._last_increase = now

    def _cap(self) -> float:
        """The most requests a second the pace may reach: the configured limit, else none."""
        c = self.configured
        return c.requests_per_s * self.headroom if c is not None and c.requests_per_s else math.inf

    def _fits(self, tokens: float) -> bool:
        lim = self.limits
        if not self._ss_over and self.inflight >= self.slow_start_window(self.clock.monotonic()):
            return False
        if self.concurrency is not None and not self.concurrency.allows(self.inflight):
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

    def _wait_for(self, ahead_requests: float, ahead_tokens: float, now: float, rank: float) -> float:
        """Seconds until ``ahead_requests`` requests and ``ahead_tokens`` tokens fit for a call of
        tier ``rank`` (lock held)."""
        lim = self.limits
        hold = max(0.0, self._hold_until - now)
        if rank >= self._shared_rank:
            hold = max(hold, self._shared_until - now)
        wait = hold
        if not self._ss_over and self._ss_start is not None:
            need = self.inflight + ahead_requests
            if need > self.slow_start_window(now) and not self._ss_over:
                wait = max(
                    wait, self._ss_start + SLOW_START_DOUBLING * math.log2(need / SLOW_START_WINDOW) - now
                )
        if lim.requests_per_s:
            wait = max(wait, (ahead_requests - self._level) / lim.requests_per_s)
        elif self.pending_learn is not None:  # first pace not known yet: what it is likely to be
            at, span = self.pending_learn
            accepted = sum(1 for t, refused in self.sends if at - LEARN_WINDOW <= t <= at and not refused)
            rate = max(1.0, accepted) / span
            wait = hold + max(0.0, ahead_requests - max(1.0, accepted)) / rate
        if lim.tokens_per_s and ahead_tokens > 0:
            need = ahead_tokens - self._tlevel
            wait = max(wait, need / lim.tokens_per_s)
        c = self.concurrency
        if c is not None and not c.allows(self.inflight + int(ahead_requests) - 1):
            wait = max(wait, c.wait_hint())  # woken early when a request ends
        return max(0.0, wait)

    def _ahead(self, rank: int, seq: int) -> tuple[float, float]:
        """Requests and tokens queued ahead of (rank, seq), itself included."""
        n, toks = 0.0, 0.0
        for w in self.waiting:
            if not w.gone and (w.rank, w.seq) <= (rank, seq):
                n += 1.0
                toks += min(w.tokens, self.limits.token_burst) if self.limits.tokens_per_s else 0.0
        return n, toks

    def _grant_due(self, now: float) -> None:
        """Grant the queue's head, and each next one, while a slot is free; a waiter that has
        just become the head is woken to plan its sleep from now (its last plan counted the ones
        ahead of it at a pace that may have changed since) (lock held)."""
        try:
            self._grant_heads(now)
        finally:
            self.track_slow_start(now)
            head = self.waiting[0] if self.waiting else None  # _grant_heads popped the gone ones
            if head is not None and not head.gone and head is not self._planned_head:
                self._planned_head = head
                _signal(head.wake)

    def _grant_heads(self, now: float) -> None:
        if self._hold_until > now:
            return
        q = self.waiting
        while q:
            head = q[0]
            if head.gone:
                heapq.heappop(q)
                continue
            if not self._fits(head.tokens) or not self._shared_take(head.tokens, head.rank, now):
                return
            heapq.heappop(q)
            self._take(head.tokens)
            head.granted = True
            _signal(head.wake)

    def _shared_take(self, tokens: float, rank: float, now: float) -> bool:
        """The fleet's slot too, when the buckets are shared (local buckets already allow it)."""
        shared = self.shared
        if shared is None:
            return True
        lim = self.limits
        if lim.requests_per_s is None and lim.tokens_per_s is None:
            return True
        if now < self._shared_until and rank >= self._shared_rank:
            return False  # refused lately at this tier: its wait is not over
        reserve = FLEET_RESERVE * min(1.0, rank / max(1, self.tiers - 1))
        answer = shared.take(
            lim.requests_per_s or 0.0, lim.request_burst, lim.tokens_per_s, lim.token_burst, tokens, reserve
        )
        if answer is None:  # the store cannot say: the local share decides, unless fail-closed
            return not self.fail_closed
        if answer > 0:
            if now >= self._shared_until:
                self._shared_rank = math.inf
            self._shared_until = max(self._shared_until, now + min(answer, 5.0))
            self._shared_rank = min(self._shared_rank, rank)
            return False
        return True

    # -- admission ---------------------------------------------------------------------------

    def try_take(self, tokens: float = 0.0, rank: float = 0) -> bool:
        """Take a slot at once for a call of tier ``rank`` if nobody waits and one is free (no
        queue, no sleep)."""
        now = self.clock.monotonic()
        with self.lock:
            self._refill(now)
            if self.waiting or self._hold_until > now or not self._fits(tokens):
                return False
            if not self._shared_take(tokens, rank, now):
                return False
            self._take(tokens)
            self.granted += 1
            return True

    def grant(self, tokens: float, waited: float) -> Grant:
        """The :class:`Grant` of a slot just taken (numbered, so headers can be dated)."""
        return Grant(self.deployment_id, tokens, waited, True, self.granted)

    def estimate(self, rank: int, tokens: float = 0.0) -> float:
        """Seconds a call of tier ``rank`` would wait if it joined the queue now."""
        now = self.clock.monotonic()
        with self.lock:
            self._refill(now)
            n, toks = self._ahead(rank, math.inf)  # type: ignore[arg-type]
            tb = self.limits.token_burst
            mine = min(tokens, tb) if self.limits.tokens_per_s else 0.0
            return self._wait_for(n + 1.0, toks + mine, now, rank)

    def join(self, rank: int, tokens: float = 0.0) -> Waiter:
        """Queue a waiter (it is granted by :meth:`wait_async` / :meth:`wait_blocking`)."""
        w = Waiter(rank, next(_SEQ), tokens)
        with self.lock:
            heapq.heappush(self.waiting, w)
            self.track_slow_start(self.clock.monotonic())
        return w

    def leave(self, w: Waiter) -> None:
        """``w`` stops waiting (cancelled, gave up); a slot it was granted is given back."""
        now = self.clock.monotonic()
        with self.lock:
            if w.granted and not w.gone:
                lim = self.limits
                if lim.requests_per_s is not None:
                    self._level = min(lim.request_burst, self._level + 1.0)
                if lim.tokens_per_s is not None:
                    self._tlevel = min(lim.token_burst, self._tlevel + w.tokens)
                if self.shared is not None:
                    self.shared.refund(w.tokens)
            w.gone = True
            self.waiting = [x for x in self.waiting if not x.gone]
            heapq.heapify(self.waiting)
            self._grant_due(now)

    def _next_wait(self, w: Waiter, now: float) -> float | None:
        """Grant what is due; None when ``w`` got its slot, else seconds until its turn (lock held)."""
        self.settle_locked(now)
        self._refill(now)
        self._grant_due(now)
        if w.granted:
            return None
        n, toks = self._ahead(w.rank, w.seq)
        self.last_bound = now
        return max(0.001, self._wait_for(n, toks, now, w.rank))

    def turn(
        self, w: Waiter, started: float, give_up_at: float, leave_at: float, wake: Any
    ) -> tuple[str | None, float]:
        """One look at ``w``'s place (the decision both wait drivers share): ``("granted", 0)``;
        ``("deadline"|"leave", 0)`` when its slot would come after ``give_up_at`` / ``leave_at``
        (monotonic; a learned pace's estimate is a guess, so it gives up only once the time is
        out); else ``(None, seconds to sleep)`` with ``wake`` set to be signalled early."""
        now = self.clock.monotonic()
        with self.lock:
            wait = self._next_wait(w, now)
            if wait is None:
                self._done(w, now - started)
                return "granted", 0.0
            due = now + wait if self.exact else now
            if due > give_up_at or due > leave_at:
                w.gone = True
                return ("deadline" if due > give_up_at else "leave"), 0.0
            w.wake = wake
        return None, min(wait, MAX_NAP, max(0.0, give_up_at - now) + 0.001)

    def _done(self, w: Waiter, waited: float) -> None:
        self.granted += 1
        self.waited_s += waited

    # -- what the provider said --------------------------------------------------------------

    def on_answer(
        self,
        headers: Mapping[str, Any] | None,
        tokens_reserved: float,
        tokens_used: float | None,
        serial: int = 0,
    ) -> bool:
        """An answer: settle its token reservation, adopt the limits its headers give; True when
        the deployment is paced afterwards."""
        now = self.clock.monotonic()
        with self.lock:
            if tokens_used is not None and self.limits.tokens_per_s is not None:
                delta = tokens_reserved - tokens_used
                self._tlevel = min(self.limits.token_burst, self._tlevel + delta)
                if self.shared is not None and delta:
                    self.shared.refund(delta)
            if headers:
                self.adopt_headers(headers, now, self.granted - serial)
            self._grant_due(now)
        return self.limited

    def give_back(self, grant: Grant) -> None:
        """An attempt that took a slot sent nothing: the slot and its tokens come back."""
        now = self.clock.monotonic()
        with self.lock:
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


def _signal(wake: Any) -> None:
    """Wake a waiter from any thread (a blocking caller's event, or an async one's future)."""
    if wake is None:
        return
    if isinstance(wake, threading.Event):
        wake.set()
    else:
        resolve(wake)
