"""The retry policy: tenacity predicates, full-jitter waits that honour Retry-After, the retry
budget, and the sleeps between attempts; the clock and the call's deadline they read are in
:mod:`._engine.clock`.

A fresh tenacity ``AsyncRetrying`` is built per call and model group (tenacity keeps attempt state
on the instance, so sharing one across concurrent calls corrupts it).
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import tenacity

from llm_resilience_plugin._engine.clock import Clock, Deadline
from llm_resilience_plugin._engine.holds import HoldQueue
from llm_resilience_plugin.errors import ErrorClass, Failure, PacedOut
from llm_resilience_plugin.policy import BackoffPolicy, EffectivePolicy, RetryBudgetPolicy


class SharedTokens(Protocol):
    """What a :class:`RetryBudget` needs from a shared bucket."""

    def tokens(self) -> float | None:
        """The fleet's level (this process's pending changes included), or None if unknown."""

    def add(self, delta: float) -> None:
        """Record a change (applied to the fleet's bucket later, atomically)."""


# The waiting one call may spend on a group's Retry-After holds: its first hold, plus this share
# (a hold extended by other calls' 429s while it waited is waited for, another round is not),
# and how far after a hold the calls queued for it come back (a share of the hold, at random).
HOLD_MARGIN = 1.3
HOLD_SPREAD = 0.2


class RetryBudget:
    """Token bucket per model group: a failure spends a token, a success refunds a fraction, and
    retries stop while the bucket is below ``min_fraction`` of its capacity. First attempts and
    fallbacks to other groups are never refused: the budget only bounds amplification.

    ``shared`` (e.g. a ``shared_state.RedisTokenBucket``) makes it one bucket for the whole fleet:
    every change is also handed to it, and the level read is the fleet's (this process's own
    changes included). While the shared bucket cannot say (``tokens()`` is None: Redis down, or
    not synced yet) the local bucket, which follows the last fleet level, is used.
    """

    def __init__(self, policy: RetryBudgetPolicy, *, shared: SharedTokens | None = None) -> None:
        self.policy = policy
        self._tokens = policy.capacity
        self._lock = threading.Lock()
        self.shared = shared

    @property
    def tokens(self) -> float:
        if self.shared is not None:
            fleet = self.shared.tokens()
            if fleet is not None:
                self._tokens = fleet  # the local bucket carries on from here if Redis goes away
                return fleet
        return self._tokens

    def _add(self, delta: float) -> None:
        with self._lock:
            self._tokens = min(self.policy.capacity, max(0.0, self._tokens + delta))
        if self.shared is not None:
            self.shared.add(delta)

    def on_failure(self) -> None:
        self._add(-1.0)

    def on_success(self) -> None:
        refund = self.policy.refund_per_success
        # A full local bucket stays full: no lock taken (as if this success came before any
        # failure that is racing it).
        if refund and (self.shared is not None or self._tokens < self.policy.capacity):
            self._add(refund)

    def spend(self) -> None:
        """A hedge draws a token as a failure would."""
        self.on_failure()

    @property
    def fraction(self) -> float:
        return self.tokens / self.policy.capacity

    def allows_retry(self) -> bool:
        if not self.policy.enabled:
            return True
        return self.tokens >= self.policy.capacity * self.policy.min_fraction


class AttemptFailed(Exception):
    """Raised by one attempt so tenacity sees the already-classified failure."""

    def __init__(self, failure: Failure, deployment_id: str | None) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.deployment_id = deployment_id


class RetryAfterHeld(Exception):
    """Nothing was sent: every deployment of the group holds a ``Retry-After`` (a skipped attempt)."""

    def __init__(self, group: str, seconds: float) -> None:
        super().__init__(f"every deployment of {group!r} holds a Retry-After for {seconds:.2f} s")
        self.group = group
        self.seconds = seconds


def backoff_delay(backoff: BackoffPolicy, retry_number: int, rng: random.Random) -> float:
    """Full jitter (AWS architecture blog): uniform(0, min(maximum, initial * 2**(n-1)))."""
    cap = min(backoff.maximum, backoff.initial * (2 ** max(0, retry_number - 1)))
    return rng.uniform(0.0, cap)


@dataclass(slots=True)
class GroupRetryState:
    """What the predicates of one group's retry loop consult."""

    policy: EffectivePolicy
    budget: RetryBudget
    deadline: Deadline
    rng: random.Random
    # Seconds until a deployment of the group can be tried without a Retry-After hold; 0 if now.
    earliest_free: Callable[[], float]
    has_fallback: bool = False
    retry_cap: int | None = None  # a priority tier's limit on retries per class
    # Exceptions the caller declared retryable beyond the taxonomy (``resilient(retry_on=...)``),
    # retried up to the class's count when the class retries, else ``retry_on_max`` times.
    retry_on: Callable[[BaseException], bool] | None = None
    retry_on_max: int = 2
    # Is any deployment of the group left that this call may still try? (None: always.)
    has_candidates: Callable[[], bool] | None = None
    # The wait for a Retry-After hold of ``hold`` seconds, at most a second value (None: the hold).
    spread_hold: Callable[[float, float], float] | None = None
    # A place in the queue of a held deployment of the group: the seconds to wait, or None when
    # every queue is full (see _engine.holds). None: waiting is not bounded that way.
    hold_slot: Callable[[], float | None] | None = None
    # Is a deployment of the group free for this call now (closed, unheld, not failed by it)?
    # Then a retry goes there without a backoff sleep. None: always back off.
    fresh_elsewhere: Callable[[], bool] | None = None
    # Are the group's holds our own load (a 429 storm, see _engine.holds)? Then nobody waits for
    # them, and a call waiting for one is woken (through ``holds``) to fail over.
    overloaded: Callable[[], bool] | None = None
    holds: HoldQueue | None = None
    waiting_hold: bool = False  # the sleep just decided waits out a hold (and may be cut short)
    cut_short: Callable[[float], None] | None = None  # told the seconds slept of a hold cut short
    retries_by_class: dict[ErrorClass, int] = field(default_factory=dict)
    gave_up_reason: str | None = None
    out_of_time: bool = False  # gave up because the deadline has no room for another attempt
    hold_waited: float = 0.0  # seconds this call has waited for Retry-After holds of the group
    hold_allowance: float | None = None  # at most one hold's worth of waiting (set by the first)
    shed: str | None = None  # why the wait just computed is not taken: fail over at once
    pacing: bool = False  # a provider's 429 is paced: the next attempt waits for its slot instead

    def should_retry(self, exc: BaseException) -> bool:
        if not isinstance(exc, AttemptFailed):
            return False
        f = exc.failure
        if isinstance(f.exception, PacedOut):
            self.gave_up_reason = "rate-limited: no slot in time on this group (nothing sent): failing over"
            return False
        cp = self.policy.classes[f.error_class]
        if self.has_candidates is not None and not self.has_candidates():
            self.gave_up_reason = "no other deployment of the group left to try: failing over"
            return False
        if (
            self.retry_on is not None
            and f.error_class is not ErrorClass.CIRCUIT_OPEN
            and self.retry_on(f.exception)
        ):
            limit = cp.max_retries if cp.action == "retry" else self.retry_on_max
            return self._take(f.error_class, limit)
        if cp.action == "failover" and f.error_class is ErrorClass.AUTH and self._sibling_free():
            return True  # another deployment of the group usually holds another key: go there first
        if cp.action != "retry":
            self.gave_up_reason = f"{f.error_class} is not retried ({cp.action})"
            return False
        allowed = cp.max_retries
        if self.retry_cap is not None and not self._paced_429(f):
            # A tier's cap keeps its retries from adding load; a paced 429's retry adds none: it
            # waits in the deployment's priority queue for a slot of its own.
            allowed = min(allowed, self.retry_cap)
        return self._take(f.error_class, allowed)

    def _paced_429(self, f: Failure) -> bool:
        return self.pacing and f.error_class is ErrorClass.RATE_LIMIT and f.status is not None

    def _sibling_free(self) -> bool:
        """Is a deployment of the group this call has not failed on free now (breaker closed, no
        hold)? An auth or quota error tries each such sibling once, as a fallback would: no
        backoff (the wait sees the fresh one) and no retry-budget token."""
        return self.fresh_elsewhere is not None and self.fresh_elsewhere()

    def _take(self, error_class: ErrorClass, allowed: int) -> bool:
        """Spend one of the class's ``allowed`` retries if any are left and the budget allows."""
        used = self.retries_by_class.get(error_class, 0)
        if used >= allowed:
            self.gave_up_reason = f"{error_class}: {allowed} retries used"
            return False
        if not self.budget.allows_retry():
            self.gave_up_reason = "retry budget exhausted"
            return False
        self.retries_by_class[error_class] = used + 1
        return True

    def wait(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, AttemptFailed) and self._paced_429(exc.failure):
            return 0.0  # the deployment's pace holds the next attempt until its slot
        retry_number = retry_state.attempt_number
        delay = backoff_delay(self.policy.backoff, retry_number, self.rng)
        if self._our_storm(exc):
            # This 429's hold refused several of our concurrent requests: our demand is beyond the
            # deployment, and the router gave its siblings the same share. Fail over at once.
            self.shed = "a 429 storm of our own (several of our requests refused at once): failing over"
            return delay
        if self.fresh_elsewhere is not None and self.fresh_elsewhere():
            delay = 0.0  # the retry goes to another healthy deployment: nothing to back off from
        if isinstance(exc, AttemptFailed) and self.policy.backoff.respect_retry_after:
            ra = exc.failure.retry_after
            # The hold applies to the deployment that sent it; wait only if nothing else is free.
            free_in = self.earliest_free()
            if ra is not None and free_in > 0:
                hold = min(ra, free_in)
                bound = self.policy.backoff.max_wait_with_fallback
                if self.has_fallback and self.hold_slot is not None and (bound is None or hold <= bound):
                    # Bounded waiting with somewhere else to go: one hold per call, and only as many
                    # calls as the group is likely to take when it lifts (so they come back together).
                    if self.hold_allowance is None:
                        self.hold_allowance = HOLD_MARGIN * hold
                    if self.overloaded is not None and self.overloaded():
                        self.shed = "the group's Retry-After holds are our own load (429 storm): failing over"
                    elif self.hold_waited + hold > self.hold_allowance:
                        self.shed = "waited out one Retry-After of the group already: failing over"
                    elif self.hold_slot() is None:
                        self.shed = "the group's Retry-After queue is full (overflow): failing over"
                    else:
                        if self.spread_hold is not None:  # with others queued: back over a fifth
                            hold = self.spread_hold(hold, hold * (1.0 + HOLD_SPREAD))  # of the hold
                        self.hold_waited += hold
                        self.waiting_hold = True
                    return max(delay, hold)
                if self.spread_hold is not None:  # the calls held together do not all come back at once
                    bound = self.policy.backoff.max_wait_with_fallback
                    most = max(hold, bound) if self.has_fallback and bound is not None else 3 * hold
                    hold = self.spread_hold(hold, min(most, self.deadline.remaining() / 2))
                delay = max(delay, hold)
        return delay

    def _our_storm(self, exc: BaseException | None) -> bool:
        """Is ``exc`` a 429 from a deployment whose current hold refused several of our
        concurrent requests, with a fallback to go to (see _engine.holds)?"""
        return (
            self.has_fallback
            and self.holds is not None
            and isinstance(exc, AttemptFailed)
            and exc.failure.error_class is ErrorClass.RATE_LIMIT
            and exc.deployment_id is not None
            and self.holds.crowded(exc.deployment_id)
        )

    def stop(self, retry_state: tenacity.RetryCallState) -> bool:
        if self.shed is not None:
            self.gave_up_reason = self.shed
            return True
        upcoming = retry_state.upcoming_sleep or 0.0
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if (
            isinstance(exc, AttemptFailed)
            and exc.failure.retry_after is not None
            and exc.failure.retry_after > self.policy.backoff.max_retry_after
            and self.earliest_free() > 0
        ):
            self.gave_up_reason = "Retry-After longer than max_retry_after: failing over"
            return True
        limit = self.policy.backoff.max_wait_with_fallback
        if (
            self.has_fallback
            and limit is not None
            and isinstance(exc, AttemptFailed)
            and exc.failure.retry_after is not None
            and min(upcoming, exc.failure.retry_after) > limit
            and self.earliest_free() > 0
        ):
            self.gave_up_reason = "Retry-After wait longer than max_wait_with_fallback: failing over"
            return True
        if upcoming + self.policy.min_attempt_time > self.deadline.remaining():
            self.gave_up_reason = "no time left for another attempt: failing over"
            self.out_of_time = True
            return True
        return False


def _loop_settings(state: GroupRetryState) -> dict[str, Any]:
    """What the async and the blocking tenacity loop share: ``state``'s predicates, reraise."""
    return {
        "retry": tenacity.retry_if_exception(state.should_retry),
        "wait": state.wait,
        "stop": state.stop,
        "reraise": True,
    }


def build_retrying(
    state: GroupRetryState,
    clock: Clock,
    before_sleep: Callable[[tenacity.RetryCallState], Awaitable[None] | None] | None = None,
) -> tenacity.AsyncRetrying:
    """A fresh tenacity loop for one call on one model group."""
    sleep = functools.partial(hold_sleep, state, clock)
    return tenacity.AsyncRetrying(sleep=sleep, before_sleep=before_sleep, **_loop_settings(state))


async def hold_sleep(state: GroupRetryState, clock: Clock, seconds: float) -> None:
    """A retry's sleep. One that waits out a Retry-After hold ends early when the group's holds
    turn out to be our own load (see _engine.holds): the call then fails over instead."""
    holds, overloaded = state.holds, state.overloaded
    if not state.waiting_hold or holds is None or overloaded is None:
        await clock.sleep(seconds)
        return
    state.waiting_hold = False
    started = clock.monotonic()
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    try:
        while not sleeper.done():
            wake = holds.wakeup()
            try:
                released = overloaded()  # it may have become so before the wakeup was registered
                if not released:
                    await asyncio.wait({sleeper, wake}, return_when=asyncio.FIRST_COMPLETED)
                    released = not sleeper.done() and overloaded()
            finally:
                holds.forget(wake)
                wake.cancel()
            if released:
                if state.cut_short is not None:
                    state.cut_short(clock.monotonic() - started)
                return
    finally:
        if not sleeper.done():
            sleeper.cancel()


def build_sync_retrying(
    state: GroupRetryState,
    clock: Clock,
    before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
) -> tenacity.Retrying:
    """The blocking twin of :func:`build_retrying` (same predicates, sleeps on ``clock``)."""
    sleep = functools.partial(hold_sleep_blocking, state, clock)
    return tenacity.Retrying(sleep=sleep, before_sleep=before_sleep, **_loop_settings(state))


def hold_sleep_blocking(state: GroupRetryState, clock: Clock, seconds: float) -> None:
    """The blocking twin of :func:`hold_sleep`: a wait for a Retry-After hold on the caller's
    thread also ends early when the group's holds turn out to be our own load. (On a fake clock
    every sleep is instant: nothing to cut short.)"""
    holds, overloaded = state.holds, state.overloaded
    if not state.waiting_hold or holds is None or overloaded is None or type(clock).sleep is not Clock.sleep:
        sleep_blocking(clock, seconds)
        return
    state.waiting_hold = False
    started = clock.monotonic()
    end = started + seconds
    while (left := end - clock.monotonic()) > 0:
        wake = holds.wakeup_event()
        try:
            released = overloaded() or (wake.wait(left) and overloaded())
        finally:
            holds.forget(wake)
        if released:
            if state.cut_short is not None:
                state.cut_short(clock.monotonic() - started)
            return


def sleep_blocking(clock: Clock, seconds: float) -> None:
    """Sleep ``seconds`` on ``clock`` from sync code (a fake clock advances instantly)."""
    if type(clock).sleep is Clock.sleep:
        if seconds > 0:
            time.sleep(seconds)
        return
    coro = clock.sleep(seconds)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    # Called from sync code inside a running loop: sleep on a helper thread's loop.
    t = threading.Thread(target=asyncio.run, args=(coro,), daemon=True)
    t.start()
    t.join()
