"""Admission before sending: which deployment of a group an attempt may go to now, under the
deployments' paces (see :mod:`._engine.pacing`), and how long it waits for its slot.

Only groups with a paced deployment get here (a configured ``rpm``/``tpm``, or a limit learned
from a 429 or from rate-limit headers); the attempt is then pinned to the deployment whose slot it
took. A call waits in that deployment's priority queue within its deadline. When the wait would
not fit - or exceeds ``backoff.max_wait_with_fallback`` while a fallback group has more headroom -
nothing is sent and the group gives up for this call: the walk goes on to the fallback chain, and
at its end the call raises :class:`~llm_resilience_plugin.errors.RateLimitWaitError` saying how
long it would have had to wait.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llm_resilience_plugin._engine.clock import Clock
from llm_resilience_plugin._engine.core import CallState
from llm_resilience_plugin._engine.pacing import DEFAULT_OUTPUT_TOKENS, Grant, Pace, Waiter
from llm_resilience_plugin._engine.retry import AttemptFailed, sleep_blocking
from llm_resilience_plugin.errors import ErrorClass, Failure, PacedOut
from llm_resilience_plugin.events import Paced

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.engine import Engine

# What an admission decides: the deployments the attempt must not go to (all but the pinned
# one), the slot it holds (None: nothing paced), or a wait on one deployment's queue.
Plan = tuple[frozenset[str], Grant | None]
NOTHING_PACED: Plan = (frozenset(), None)


def _candidates(engine: Engine, call: CallState, group: str, exclude: frozenset[str]) -> list[str]:
    """The deployments of ``group`` this attempt may use, those it has not failed on first (each
    half in a random order weighted as LiteLLM's shuffle is); none while a probe is due."""
    now = engine.clock.wall()
    ids = [d for d in engine.admissible(call, group, now) if d not in exclude]
    if any(engine.breaker_state(d) != "closed" for d in ids):
        # A deployment is due for its probe: the breakers admit this attempt (the probe first,
        # else a closed one), unpinned - pinning would keep the probe from ever being sent, or
        # refuse the call when another takes the probe slot.
        return []
    _spread(engine, ids)
    if call.failed:
        ids.sort(key=lambda d: d in call.failed)
    return ids


# LiteLLM's simple-shuffle weights, in the order it reads them (litellm_params).
SPREAD_KEYS = ("weight", "rpm", "tpm")


def _spread(engine: Engine, ids: list[str]) -> None:
    """Order ``ids`` at random by LiteLLM's simple-shuffle weights (``weight``, else ``rpm``, else
    ``tpm``, where a deployment of the group sets one), so an admitted attempt goes where the
    user's routing would send it as often (a weighted draw without replacement)."""
    weights = [1.0] * len(ids)
    for key in SPREAD_KEYS:
        got = [engine.deployments[d].params.get(key) for d in ids]
        if any(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in got):
            weights = [float(v) if isinstance(v, int | float) and v > 0 else 1e-9 for v in got]
            break
    with engine.rng_lock:
        keys = {d: engine.rng.random() ** (1.0 / w) for d, w in zip(ids, weights, strict=True)}
    ids.sort(key=lambda d: keys[d], reverse=True)


def tokens_for(engine: Engine, group: str, messages: Any, kwargs: Mapping[str, Any]) -> float:
    """The tokens one attempt reserves against a token limit: its input counted with LiteLLM's
    counter, its output bounded by ``max_tokens`` (else a default, corrected from its usage)."""
    out = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens") or kwargs.get("max_output_tokens")
    output = float(DEFAULT_OUTPUT_TOKENS)
    if isinstance(out, int) and not isinstance(out, bool) and out > 0:
        output = float(out)
    ids = engine.group_deployments.get(group) or []
    model = engine.deployments[ids[0]].model if ids else "gpt-4o-mini"
    try:
        import litellm

        if isinstance(messages, list):
            counted = float(litellm.token_counter(model=model, messages=messages))
        else:
            counted = float(litellm.token_counter(model=model, text=str(messages)))
    except Exception:
        counted = len(str(messages)) / 4  # a rough count rather than none
    return counted + output


def _wants_tokens(paces: Mapping[str, Pace], ids: list[str]) -> bool:
    return any(paces[d].limits.tokens_per_s is not None for d in ids)


def _pin(engine: Engine, group: str, dep: str) -> frozenset[str]:
    return frozenset(d for d in engine.group_deployments[group] if d != dep)


def _fallback_wait(engine: Engine, call: CallState, group: str, rank: int, tokens: float) -> float:
    """The shortest wait on the next fallback group (0.0 when a deployment there is unpaced or
    free; inf when there is none)."""
    requested = call.report.requested_group
    for fb in engine.fallback_chain(requested, ErrorClass.RATE_LIMIT):
        if fb == group or fb not in engine.group_deployments:
            continue
        ids = [d for d in engine.admissible(call, fb, engine.clock.wall())]
        if not ids:
            continue
        waits = [engine.paces[d].estimate(rank, tokens) if engine.paces[d].limited else 0.0 for d in ids]
        return min(waits)
    return math.inf


FALLBACK_HAS_ROOM = "{group!r} is at its rate limit and a fallback has headroom"
NO_ROOM = "{group!r} is at its rate limit for longer than the deadline leaves"


def _decide(
    engine: Engine,
    call: CallState,
    group: str,
    exclude: frozenset[str],
    messages: Any,
    kwargs: Mapping[str, Any],
) -> tuple[Plan | None, Pace | None, float, float, float, float]:
    """(a plan taken at once, or None and the pace to queue on, its estimated wait, the tokens,
    the latest monotonic time to wait until, and the time past which a fallback is better)."""
    paces = engine.paces
    ids = _candidates(engine, call, group, exclude)
    if not ids:
        return NOTHING_PACED, None, 0.0, 0.0, 0.0, 0.0  # the breakers decide (nothing admissible)
    for d in ids:
        paces[d].settle_learning()
    if not any(paces[d].admits for d in ids):
        for d in ids:
            paces[d].forget_if_idle()
        engine.paces.on = any(p.limited for p in paces.values())  # back to the fast path
        return NOTHING_PACED, None, 0.0, 0.0, 0.0, 0.0
    tokens = tokens_for(engine, group, messages, kwargs) if _wants_tokens(paces, ids) else 0.0
    rank = engine.paces.rank_of(call)
    for d in ids:
        p = paces[d]
        if not p.admits:
            return (_pin(engine, group, d), None), None, 0.0, tokens, 0.0, 0.0
        if p.try_take(tokens, rank):
            return (_pin(engine, group, d), p.grant(tokens, 0.0)), None, 0.0, tokens, 0.0, 0.0
    wait, dep = min((paces[d].estimate(rank, tokens), d) for d in ids)
    pol = engine.policies[group]
    room = call.deadline.remaining() - pol.min_attempt_time
    bound = pol.backoff.max_wait_with_fallback
    now = engine.clock.monotonic()
    leave_at = math.inf
    if bound is not None and engine.has_fallback(call, group):
        other = _fallback_wait(engine, call, group, rank, tokens)
        if wait > bound and other < wait:
            raise _paced_out(engine, call, group, wait, FALLBACK_HAS_ROOM.format(group=group))
        if other < math.inf:
            leave_at = now + bound  # a wait that grows past the bound leaves for the fallback
    if wait > room and paces[dep].exact:  # a learned pace's estimate is a guess: wait and see
        raise _paced_out(engine, call, group, wait, NO_ROOM.format(group=group))
    return None, paces[dep], wait, tokens, now + room, leave_at


def _paced_out(engine: Engine, call: CallState, group: str, wait: float, why: str) -> AttemptFailed:
    """Record a skipped attempt (nothing sent) and the failure the group gives up on."""
    call.attempt_no += 1
    wait_before, call.next_wait = call.next_wait, 0.0
    failure = Failure(
        ErrorClass.RATE_LIMIT, None, str(PacedOut(group, wait, why)), wait, PacedOut(group, wait, why)
    )
    call.add_failure(failure)
    engine.record(call, group, 0, None, failure, engine.clock.wall(), 0.0, wait_before, "skipped")
    return AttemptFailed(failure, None)


def _gave_up(
    engine: Engine, call: CallState, group: str, pace: Pace, outcome: str, started: float
) -> AttemptFailed:
    waited = engine.clock.monotonic() - started
    call.report.queued_s += waited
    left = pace.estimate(engine.paces.rank_of(call))
    why = FALLBACK_HAS_ROOM if outcome == "leave" else NO_ROOM
    return _paced_out(engine, call, group, left, why.format(group=group))


def _queued(engine: Engine, call: CallState, group: str, pace: Pace, waited: float, tokens: float) -> Plan:
    call.report.queued_s += waited
    call.report.paced += 1
    call.next_wait += waited  # the attempt's record shows the wait before it, the queue's included
    engine.emit(
        call, Paced(call.call_id, group, pace.deployment_id, waited, call.report.priority, pace.queued)
    )
    return _pin(engine, group, pace.deployment_id), pace.grant(tokens, waited)


# How often a waiter with sibling deployments looks whether one of them has a slot (seconds).
ELSEWHERE_EVERY = 0.25


async def wait_async(
    pace: Pace, w: Waiter, give_up_at: float, leave_at: float, elsewhere: _Sibling | None
) -> str:
    """Wait (async) for ``w``'s slot: ``granted``, ``deadline``, ``leave`` (a fallback has more
    headroom) or ``moved`` (a sibling deployment has a slot now: ``elsewhere`` took it)."""
    loop = asyncio.get_running_loop()
    real = type(pace.clock).sleep is Clock.sleep
    started = pace.clock.monotonic()
    outcome: str | None = None
    try:
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            outcome, wait = pace.turn(w, started, give_up_at, leave_at, fut)
            if outcome is not None:
                return outcome
            if elsewhere is not None:
                if elsewhere():
                    w.gone = True
                    outcome = "moved"
                    return outcome
                wait = min(wait, ELSEWHERE_EVERY)
            if real:
                try:
                    await asyncio.wait_for(fut, wait)
                except TimeoutError:
                    pass
            else:
                await pace.clock.sleep(wait)
    finally:
        w.wake = None
        if outcome != "granted":  # cancelled, gave up or moved: out of the queue, its slot back
            pace.leave(w)


def wait_blocking(
    pace: Pace, w: Waiter, give_up_at: float, leave_at: float, elsewhere: _Sibling | None
) -> str:
    """The blocking twin of :func:`wait_async`, on the caller's thread."""
    real = type(pace.clock).sleep is Clock.sleep
    started = pace.clock.monotonic()
    outcome: str | None = None
    try:
        while True:
            event = threading.Event()
            outcome, wait = pace.turn(w, started, give_up_at, leave_at, event)
            if outcome is not None:
                return outcome
            if elsewhere is not None:
                if elsewhere():
                    w.gone = True
                    outcome = "moved"
                    return outcome
                wait = min(wait, ELSEWHERE_EVERY)
            if real:
                event.wait(wait)
            else:
                sleep_blocking(pace.clock, wait)
    finally:
        w.wake = None
        if outcome != "granted":
            pace.leave(w)


class _Sibling:
    """While a call waits on one deployment's queue: does another of the group have a slot now?"""

    def __init__(
        self,
        engine: Engine,
        call: CallState,
        group: str,
        exclude: frozenset[str],
        waiting: str,
        tokens: float,
    ):
        self.others = [d for d in _candidates(engine, call, group, exclude) if d != waiting]
        self.paces = engine.paces
        self.tokens = tokens
        self.rank = engine.paces.rank_of(call)
        self.taken: str | None = None

    def __call__(self) -> bool:
        for d in self.others:
            p = self.paces[d]
            if p.try_take(self.tokens, self.rank):
                self.taken = d
                return True
        return False


def _after_wait(
    engine: Engine,
    call: CallState,
    group: str,
    exclude: frozenset[str],
    pace: Pace,
    outcome: str,
    started: float,
    sibling: _Sibling | None,
    tokens: float,
) -> Plan:
    if outcome == "moved" and sibling is not None and sibling.taken is not None:
        moved = engine.paces[sibling.taken]
        plan = _queued(engine, call, group, moved, engine.clock.monotonic() - started, tokens)
    elif outcome != "granted":
        raise _gave_up(engine, call, group, pace, outcome, started)
    else:
        plan = _queued(engine, call, group, pace, engine.clock.monotonic() - started, tokens)
    return (exclude | plan[0], plan[1])


def _prepare(
    engine: Engine,
    call: CallState,
    group: str,
    exclude: frozenset[str],
    messages: Any,
    kwargs: Mapping[str, Any],
) -> tuple[Plan | None, Any]:
    plan, pace, _wait, tokens, give_up_at, leave_at = _decide(engine, call, group, exclude, messages, kwargs)
    if plan is not None:
        return (exclude | plan[0], plan[1]), None
    assert pace is not None
    sibling = _Sibling(engine, call, group, exclude, pace.deployment_id, tokens)
    waiter = pace.join(engine.paces.rank_of(call), tokens)
    return None, (pace, waiter, give_up_at, leave_at, sibling if sibling.others else None, tokens)


async def admit(
    engine: Engine,
    call: CallState,
    group: str,
    exclude: frozenset[str],
    messages: Any,
    kwargs: Mapping[str, Any],
) -> Plan:
    """Where the attempt may go now, after waiting for a slot if it must (async)."""
    plan, waiting = _prepare(engine, call, group, exclude, messages, kwargs)
    if plan is not None:
        return plan
    pace, w, give_up_at, leave_at, sibling, tokens = waiting
    started = engine.clock.monotonic()
    outcome = await wait_async(pace, w, give_up_at, leave_at, sibling)
    return _after_wait(engine, call, group, exclude, pace, outcome, started, sibling, tokens)


def admit_sync(
    engine: Engine,
    call: CallState,
    group: str,
    exclude: frozenset[str],
    messages: Any,
    kwargs: Mapping[str, Any],
) -> Plan:
    """The blocking twin of :func:`admit`, on the caller's thread."""
    plan, waiting = _prepare(engine, call, group, exclude, messages, kwargs)
    if plan is not None:
        return plan
    pace, w, give_up_at, leave_at, sibling, tokens = waiting
    started = engine.clock.monotonic()
    outcome = wait_blocking(pace, w, give_up_at, leave_at, sibling)
    return _after_wait(engine, call, group, exclude, pace, outcome, started, sibling, tokens)
