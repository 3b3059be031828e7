"""One attempt's life on the engine: opened (or skipped for want of time), sent through the
dispatcher, and counted — answered, failed (classified once) or cancelled — in async and blocking
twins that share every step but the send."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from llm_resilience_plugin._engine import admission, overload
from llm_resilience_plugin._engine.attempt import ATTEMPT_IDS, AttemptContext
from llm_resilience_plugin._engine.core import (
    CallState,
    DeadlineSkip,
    Served,
    attempt_timeouts,
    coarse_timeout,
)
from llm_resilience_plugin._engine.dispatch import SyncDispatcher
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.retry import AttemptFailed
from llm_resilience_plugin._engine.taxonomy import classify
from llm_resilience_plugin._error_bodies import bounded
from llm_resilience_plugin.errors import ErrorClass, Failure
from llm_resilience_plugin.events import AttemptInfo, usage_of


def begin(
    engine: Engine,
    call: CallState,
    group: str,
    level: int,
    exclude: frozenset[str] = frozenset(),
    holder: list[AttemptContext] | None = None,
) -> tuple[AttemptContext, float, float, float, float]:
    """Open an attempt: (context, timeout sent, hard bound, started wall time, wait before it);
    :class:`AttemptFailed` without sending when the deadline has no room for it."""
    pol = engine.policies[group]
    call.attempt_no += 1
    wait_before, call.next_wait = call.next_wait, 0.0
    deadline = call.deadline
    remaining = max(0.0, deadline.expires_at - deadline.clock.monotonic())  # remaining(), inline
    started_wall = engine.clock.wall()
    if remaining <= pol.min_attempt_time:
        failure = Failure(
            ErrorClass.TIMEOUT,
            None,
            "call deadline exhausted before the attempt",
            None,
            DeadlineSkip("call deadline exhausted"),
        )
        call.add_failure(failure)
        engine.record(call, group, level, None, failure, started_wall, 0.0, wait_before, "skipped")
        raise AttemptFailed(failure, None)
    held = overload.held_back(engine, call, group) if engine.hold_until and not exclude else None
    if held is not None:  # every deployment asked to be left alone for now: wait or fail over
        call.add_failure(held)
        engine.record(call, group, level, None, held, started_wall, 0.0, wait_before, "skipped")
        raise AttemptFailed(held, None)
    limit = engine.first_chunk_timeout(call, group) if call.stream else engine.answer_timeout(call, group)
    # A limit learned from answer times (none of the configured ones) changes every few answers:
    # LiteLLM gets it coarse, so it does not build a new HTTP client for each new value.
    cap = call.opts.attempt_timeout or pol.attempt_timeout
    learned = limit != cap and limit != pol.first_chunk_timeout and limit != call.opts.first_chunk_timeout
    timeout, sent_timeout, bound = attempt_timeouts(limit, remaining, cap if learned else None)
    if call.stream and sent_timeout < (whole := min(cap, remaining)):
        # LiteLLM's timeout is also every later read's: a pause between chunks is the idle
        # watchdog's to judge, so LiteLLM gets the attempt's whole limit and the watchdog holds
        # the first chunk's, exactly.
        sent_timeout, bound = (whole if whole == cap else coarse_timeout(whole, cap)), timeout
    actx = AttemptContext(  # positional: a dataclass's __init__ takes keywords measurably slower
        engine,
        call,
        group,
        exclude,
        f"{id(engine)}:{call.call_id}:{next(ATTEMPT_IDS)}",  # token
        holder is not None,  # hedged
        timeout,  # timeout_s
        call.attempt_no,  # number
    )
    if holder is not None:
        holder.append(actx)
    return actx, sent_timeout, bound, started_wall, wait_before


def cancelled(
    engine: Engine, actx: AttemptContext, level: int, t0: float, started_wall: float, wait_before: float
) -> None:
    """The attempt was cancelled (or abandoned): its breaker counts nothing; guards settle."""
    engine.release(actx.admission)
    engine.paces.finished(actx.grant, actx.sent)  # in flight: its place frees; unsent: its slot back
    if actx.guard_tokens:
        if actx.sent:  # in flight: the provider may bill it; the guard's policy decides
            actx.settle_guards(None, None, None, billable=True)
        else:  # nothing was sent: a plain release
            nothing = Failure(
                ErrorClass.UNKNOWN, None, "cancelled before sending", None, asyncio.CancelledError()
            )
            actx.settle_guards(None, None, nothing)
    latency = engine.clock.monotonic() - t0
    cancelled = Failure(ErrorClass.UNKNOWN, None, "cancelled", None, asyncio.CancelledError())
    engine.record(
        actx.call, actx.group, level, actx, cancelled, started_wall, latency, wait_before, "cancelled"
    )


def failed(
    engine: Engine,
    actx: AttemptContext,
    level: int,
    exc: BaseException,
    t0: float,
    started_wall: float,
    wait_before: float,
) -> AttemptFailed:
    """Classify the attempt's error once and count it; the :class:`AttemptFailed` to raise."""
    latency = engine.clock.monotonic() - t0
    failure = classify(exc)
    engine.attempt_failed(actx.call, actx.group, level, actx, failure, started_wall, latency, wait_before)
    return AttemptFailed(failure, actx.picked)


def stream_ended(
    engine: Engine,
    actx: AttemptContext,
    level: int,
    t0: float,
    started_wall: float,
    wait_before: float,
    exc: BaseException | None = None,
    *,
    final: bool = True,
    ttft: float | None = None,
    **served: Any,
) -> Failure | None:
    """Account for a live stream's end after its first chunk (every dispatcher's streams): its
    attempt succeeded, or failed (classified once, returned); the call's report is then final
    and published, unless ``final`` is False (a failure that a recovery takes over)."""
    call, latency = actx.call, engine.clock.monotonic() - t0
    r = call.report
    failure = None
    if exc is None:
        engine.attempt_succeeded(
            call, actx.group, level, actx, started_wall, latency, wait_before, ttft, **served
        )
        r.outcome, r.error_class, r.deployment_id = "success", None, actx.picked
    else:
        failure = classify(exc)
        engine.attempt_failed(call, actx.group, level, actx, failure, started_wall, latency, wait_before)
        if not final:
            return failure
        r.outcome, r.error_class = "failure", failure.error_class
    r.total_latency_s = engine.clock.wall() - r.started_at
    engine.emit(call, r)
    return failure


def answered(
    engine: Engine,
    actx: AttemptContext,
    level: int,
    resp: Any,
    t0: float,
    started_wall: float,
    wait_before: float,
    messages: Any,
    kwargs: Mapping[str, Any],
) -> Any:
    """Count an answer (a live stream is counted when it ends); what the caller gets."""
    dispatcher = engine.dispatcher
    assert dispatcher is not None
    call = actx.call
    latency = engine.clock.monotonic() - t0
    if call.stream:
        engine.timings[actx.group].observe_ttft(latency)
        return dispatcher.wrap_stream(
            actx, level, resp, started_wall, latency, wait_before, messages, dict(kwargs)
        )
    usage = usage_of(resp)
    call.served = Served(resp, usage, actx.picked)
    engine.attempt_succeeded(
        call, actx.group, level, actx, started_wall, latency, wait_before, response=resp, usage=usage
    )
    return resp


async def attempt(
    engine: Engine,
    call: CallState,
    group: str,
    level: int,
    messages: Any,
    kwargs: Mapping[str, Any],
    *,
    exclude: frozenset[str] = frozenset(),
    holder: list[AttemptContext] | None = None,
) -> Any:
    """Send one attempt through the dispatcher and account for its outcome; a failure is
    raised as :class:`AttemptFailed` (classified once)."""
    dispatcher = engine.dispatcher
    assert dispatcher is not None, "an engine needs a dispatcher before its first call"
    grant = None
    if engine.paces.on:  # some deployment is rate-limited: wait for a slot, pinned to it
        exclude, grant = await admission.admit(engine, call, group, exclude, messages, kwargs)
    try:
        actx, timeout_s, bound, started_wall, wait_before = begin(engine, call, group, level, exclude, holder)
    except AttemptFailed:
        if grant is not None:  # no time left to send it: the slot goes back
            engine.paces[grant.deployment_id].give_back(grant)
        raise
    actx.grant = grant
    t0 = engine.clock.monotonic()
    try:
        if engine.guards:
            guard_before(engine, call, actx, group, level, messages, kwargs)
        with bounded():  # a long error body is cut before LiteLLM redacts it on the loop
            resp = await dispatcher.send(actx, messages, dict(kwargs), timeout_s=timeout_s, bound=bound)
    except asyncio.CancelledError:
        cancelled(engine, actx, level, t0, started_wall, wait_before)
        raise
    except BaseException as exc:  # classify once, then decide
        if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
            raise
        raise failed(engine, actx, level, exc, t0, started_wall, wait_before) from None
    finally:
        if actx.cleanups:
            actx.clean_up()
    return answered(engine, actx, level, resp, t0, started_wall, wait_before, messages, kwargs)


def attempt_sync(
    engine: Engine, call: CallState, group: str, level: int, messages: Any, kwargs: Mapping[str, Any]
) -> Any:
    """The blocking twin of :func:`attempt`, on the caller's thread (a dispatcher with
    ``send_sync``); an interrupt or a generator's close counts as a cancellation."""
    dispatcher = engine.dispatcher
    if not isinstance(dispatcher, SyncDispatcher):
        raise TypeError(f"blocking attempts need a SyncDispatcher (with send_sync), not {dispatcher!r}")
    exclude: frozenset[str] = frozenset()
    grant = None
    if engine.paces.on:  # some deployment is rate-limited: wait for a slot, pinned to it
        exclude, grant = admission.admit_sync(engine, call, group, exclude, messages, kwargs)
    try:
        actx, timeout_s, bound, started_wall, wait_before = begin(engine, call, group, level, exclude)
    except AttemptFailed:
        if grant is not None:  # no time left to send it: the slot goes back
            engine.paces[grant.deployment_id].give_back(grant)
        raise
    actx.grant = grant
    t0 = engine.clock.monotonic()
    try:
        if engine.guards:
            guard_before(engine, call, actx, group, level, messages, kwargs)
        with bounded():
            resp = dispatcher.send_sync(actx, messages, dict(kwargs), timeout_s=timeout_s, bound=bound)
    except Exception as exc:
        raise failed(engine, actx, level, exc, t0, started_wall, wait_before) from None
    except BaseException:
        cancelled(engine, actx, level, t0, started_wall, wait_before)
        raise
    finally:
        actx.clean_up()
    return answered(engine, actx, level, resp, t0, started_wall, wait_before, messages, kwargs)


def guard_before(
    engine: Engine,
    call: CallState,
    actx: AttemptContext,
    group: str,
    level: int,
    messages: list[dict[str, Any]],
    kwargs: Mapping[str, Any],
) -> None:
    ids = engine.admissible(call, group, engine.clock.wall()) or engine.group_deployments[group]
    deployments = tuple(engine.deployments[d] for d in ids)
    info = AttemptInfo(
        call_id=call.call_id,
        attempt=actx.number,
        model_group=group,
        fallback_level=level,
        deployments=deployments,
        messages=messages,
        kwargs={k: v for k, v in kwargs.items() if k != "metadata"},
        metadata=dict(kwargs.get("metadata") or {}),
        stream=call.stream,
        idempotency_key=call.report.idempotency_key,
        operation=call.operation,
    )
    tokens: list[tuple[Any, Any]] = []
    actx.guard_tokens = tokens  # a guard raising leaves the earlier ones' tokens to settle
    for guard in engine.guards:
        tokens.append((guard, guard.before_attempt(info)))
