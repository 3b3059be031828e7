"""The drivers: walk a call's routes with the engine — attempts, tenacity retries inside a group,
hedges, fallbacks, degradation — and a private event-loop thread so sync calls run the same loop.

Routing and retry decisions come from :mod:`._engine.core` and :mod:`._engine.retry`; these
functions sequence them, await attempts and sleep. One decision is made here: when a group gives
up, ``_after_exhausted`` trims the context and goes again, fails over, answers statically or
raises the call's final error (for the async and the sync walk alike).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import tenacity

from llm_resilience_plugin._engine import attempts, overload
from llm_resilience_plugin._engine.attempt import AttemptContext
from llm_resilience_plugin._engine.core import CallState, final_error, next_route, wants_static_answer
from llm_resilience_plugin._engine.degradation import (
    apply_level,
    context_limit_from_error,
    prompt_tokens_from_error,
    static_response,
    trim_messages,
)
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.hedging import HedgeState
from llm_resilience_plugin._engine.prefill import fits
from llm_resilience_plugin._engine.retry import (
    AttemptFailed,
    GroupRetryState,
    build_retrying,
    build_sync_retrying,
)
from llm_resilience_plugin.errors import ErrorClass, Failure
from llm_resilience_plugin.events import (
    FallbackTaken,
    HedgeSent,
    RetryScheduled,
)


@dataclass(slots=True)
class _Walk:
    """Where a call's route walk stands: the group and level it is on, what it has tried."""

    requested: str
    messages: Any
    kwargs: dict[str, Any]
    group: str = ""
    level: int = 0
    tried: list[str] | None = None  # the groups walked, made on the first fallback decision
    trimmed: bool = False

    def __post_init__(self) -> None:
        self.group = self.requested

    def walked(self) -> list[str]:
        """The groups walked so far, the requested one first."""
        if self.tried is None:
            self.tried = [self.requested]
        return self.tried


# Operations whose kwargs a degradation level may change (max_tokens, tools).
_TOKEN_LIMITED = frozenset({"completion", "text_completion"})

# What _after_exhausted returns when the walk goes on (anything else is the call's answer).
_AGAIN: Any = object()


def _for_group(call: CallState, group: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's kwargs as sent to ``group``: its ``kwargs_by_group`` entry over them."""
    over = call.opts.kwargs_by_group.get(group)
    return {**kwargs, **over} if over else kwargs


def _after_exhausted(
    engine: Engine, call: CallState, walk: _Walk, failure: Failure, base_kwargs: dict[str, Any]
) -> Any:
    """A group gave up on ``failure``: trim and go again, fail over (both: ``_AGAIN``), answer
    statically (the answer), or raise the call's final error. Shared by the async and sync walk."""
    degradation = engine.policies[walk.requested].degradation
    chain = engine.fallback_chain(walk.requested, failure.error_class)
    nxt = next_route(
        call, engine.policy, engine.policies[walk.requested], chain, failure, walk.walked(), walk.level
    )
    if (
        nxt is None
        and engine.degrades
        and not call.require_prefill  # a continuation that does not fit restarts from scratch
        and not walk.trimmed
        and failure.error_class is ErrorClass.CONTEXT_WINDOW
        and degradation.trim_context_on_overflow
        and call.operation == "completion"  # only chat messages can be trimmed
    ):
        smaller = _trimmed(engine, walk.group, walk.messages, walk.kwargs, failure, degradation)
        if smaller is not None:
            walk.trimmed = True
            call.report.degraded.append(f"context trimmed: {len(walk.messages)} -> {len(smaller)} messages")
            walk.messages = smaller
            return _AGAIN
    if nxt is None:
        static = (
            _static_answer(engine, call, walk.requested, failure, walk.messages)
            if engine.degrades
            and call.operation == "completion"  # a static answer is a chat reply
            and not call.restricted  # nor a continuation of a broken stream
            else None
        )
        if static is not None:
            finish(engine, call, static, None, group=None, level=walk.level)
            return static
        finish(engine, call, None, failure)
        err = final_error(call, engine.policy.min_attempt_time, engine.as_itself)
        raise err from err.__cause__
    engine.emit(call, FallbackTaken(call.call_id, walk.group, nxt, walk.level + 1, failure.error_class))
    if failure.error_class is ErrorClass.RATE_LIMIT:
        engine.paces.failover(engine.group_deployments.get(nxt, ()))
    walk.walked().append(nxt)
    walk.group = nxt
    walk.level += 1
    if engine.degrades:
        walk.kwargs = _degrade_for_level(
            engine, call, degradation.levels.get(walk.level), base_kwargs, walk.level
        )
    else:
        walk.kwargs = base_kwargs
    walk.kwargs = _for_group(call, nxt, walk.kwargs)
    return _AGAIN


async def walk_routes(
    engine: Engine, call: CallState, requested: str, messages: Any, kwargs: dict[str, Any]
) -> Any:
    """The whole call: the requested group, then its fallback chain, until one answers."""
    # The walk's state is made when a group first gives up (most calls answer in the first).
    walk: _Walk | None = None
    group, level, msgs, kw = requested, 0, messages, _for_group(call, requested, kwargs)
    while True:
        if walk is not None:
            group, level, msgs, kw = walk.group, walk.level, walk.messages, walk.kwargs
        failure = _passed_over(engine, call, group)
        if failure is None:
            try:
                # The first attempt runs before tenacity is built: most calls succeed at once and
                # never pay for a retry loop. A failure is handed to tenacity as its attempt 1.
                call.next_wait = 0.0
                call.out_of_time = False
                hedge = engine.hedges.get(group) if engine.hedges else None  # no call: none configured
                if hedge is not None:
                    hedge = engine.hedge_for(call, group)
                try:
                    if hedge is None:
                        result = await attempts.attempt(engine, call, group, level, msgs, kw)
                    else:
                        result = await _hedged_attempt(engine, call, group, level, msgs, kw, hedge)
                except AttemptFailed as first:
                    result = await _retry_group(engine, call, group, level, msgs, kw, hedge, first)
            except AttemptFailed as af:
                failure = af.failure
            else:
                finish(engine, call, result, None, group=group, level=level)
                return result
        walk = walk or _Walk(requested, messages, _for_group(call, requested, kwargs))
        step = _after_exhausted(engine, call, walk, failure, kwargs)
        if step is not _AGAIN:
            return step


def walk_routes_sync(
    engine: Engine,
    call: CallState,
    requested: str,
    messages: Any,
    kwargs: dict[str, Any],
    before_retry: Callable[[tenacity.RetryCallState], None] | None = None,
) -> Any:
    """The blocking twin of :func:`walk_routes` on the caller's thread (no hedging): for
    dispatchers whose attempts must run where the caller runs (LangChain sync runnables)."""
    walk = _Walk(requested, messages, _for_group(call, requested, kwargs))
    while True:
        group, level = walk.group, walk.level
        failure = _passed_over(engine, call, group)
        if failure is None:
            state = _group_state(engine, call, group)

            def before_sleep(rs: tenacity.RetryCallState, group: str = group) -> None:
                _retry_scheduled(engine, call, group, rs)
                if before_retry is not None:
                    before_retry(rs)

            call.next_wait = 0.0
            call.out_of_time = False
            try:
                for attempt in build_sync_retrying(state, engine.clock, before_sleep):
                    with attempt:
                        result = attempts.attempt_sync(engine, call, group, level, walk.messages, walk.kwargs)
            except AttemptFailed as af:
                if state.out_of_time:
                    call.out_of_time = True
                failure = af.failure
            else:
                finish(engine, call, result, None, group=group, level=level)
                return result
        step = _after_exhausted(engine, call, walk, failure, kwargs)
        if step is not _AGAIN:
            return step


def _trimmed(
    engine: Engine,
    group: str,
    messages: list[dict[str, Any]],
    kwargs: Mapping[str, Any],
    failure: Failure,
    degradation: Any,
) -> list[dict[str, Any]] | None:
    import litellm

    ids = engine.group_deployments.get(group, [])
    model = engine.deployments[ids[0]].model if ids else "gpt-4o-mini"
    limit = context_limit_from_error(failure.message)
    if limit is None:
        try:
            limit = int(litellm.get_model_info(model).get("max_input_tokens") or 0) or None
        except Exception:
            limit = None
    if limit is None:
        return None
    return trim_messages(
        messages,
        limit,
        model=model,
        reserve_output=int(kwargs.get("max_tokens") or 0),
        keep_last=degradation.keep_last_messages,
        provider_count=prompt_tokens_from_error(failure.message),
    )


def _degrade_for_level(
    engine: Engine, call: CallState, level_policy: Any, kwargs: dict[str, Any], level: int
) -> dict[str, Any]:
    # max_tokens and tools exist on chat and text completions only; the deadline cap is for all.
    out, changes = apply_level(kwargs, level_policy) if call.operation in _TOKEN_LIMITED else (kwargs, [])
    if level_policy is not None and level_policy.deadline is not None:
        capped = engine.clock.monotonic() + level_policy.deadline
        if capped < call.deadline.expires_at:
            call.deadline.expires_at = capped
            changes.append(f"deadline={level_policy.deadline}s")
    if changes:
        call.report.degraded.append(f"fallback level {level}: " + ", ".join(changes))
    return out


def _static_answer(
    engine: Engine, call: CallState, requested: str, failure: Failure, messages: list[dict[str, Any]]
) -> Any | None:
    text = wants_static_answer(call, failure, engine.policies[requested].degradation.static_answers)
    if text is None:
        return None
    scenario = call.opts.scenario or ""
    call.report.degraded.append(f"static answer: {scenario}")
    resp = static_response(text, requested, scenario, messages)
    if call.stream:
        assert engine.dispatcher is not None
        return engine.dispatcher.static_stream(resp, call)
    return resp


def finish(
    engine: Engine,
    call: CallState,
    result: Any,
    failure: Failure | None,
    *,
    group: str | None = None,
    level: int = 0,
) -> None:
    """Fill the call's report from its outcome and publish it (a live stream publishes at its end)."""
    if failure is not None and (call.tentative or call.restricted):
        return  # not the call's end: a broken stream recovering has another way to go
    r = call.report
    r.total_latency_s = engine.clock.wall() - r.started_at
    if failure is not None:
        r.outcome = "failure"
        r.error_class = failure.error_class
    else:
        r.outcome = "success"
        r.served_group = group
        r.fallback_level = level
        served = call.served
        if served is not None and served.response is result:  # what the attempt read
            r.deployment_id, usage = served.deployment_id, served.usage
        else:  # a static answer, or a stream
            last = next((a for a in reversed(r.attempts) if a.outcome == "success"), None)
            r.deployment_id, usage = (last.deployment_id if last else None), None
        assert engine.dispatcher is not None
        if result is not None:
            engine.dispatcher.annotate(r, result, usage)
    if call.tentative:
        return  # a broken stream's recovery: it publishes the report once it has counted itself
    if (not call.stream or failure is not None) and (call.listener is not None or engine.events.active):
        engine.emit(call, r)


def _has_candidates(engine: Engine, call: CallState, group: str) -> bool:
    """Is any deployment of ``group`` left that this call has not ruled out (and, for a stream
    continued by prefill, that can take one)?"""
    if call.restricted:
        return any(
            d not in call.never_again and fits(engine, call, d) for d in engine.group_deployments[group]
        )
    return any(d not in call.never_again for d in engine.group_deployments[group])


def _passed_over(engine: Engine, call: CallState, group: str) -> Failure | None:
    """The failure to hand on when the walk goes straight past ``group``, nothing to record:
    every deployment of it already failed this call (a stream resuming elsewhere), the caller's
    avoid_deployments rule them all out, or none can continue a stream by prefill. None: try it."""
    if (call.failures or call.opts.avoid or call.restricted) and not _has_candidates(engine, call, group):
        return _last_failure(call, group)
    return None


def _last_failure(call: CallState, group: str) -> Failure:
    """Why ``group`` has nothing left for this call: its last failure, or the caller's
    ``avoid_deployments`` (a call continuing one that failed there, e.g. a broken stream)."""
    if call.failures:
        return call.failures[-1]
    why = f"every deployment of {group!r} is in avoid_deployments: nothing sent"
    return Failure(ErrorClass.CONNECTION, None, why, None, ConnectionError(why))


def _group_state(engine: Engine, call: CallState, group: str) -> GroupRetryState:
    """What one group's retry predicates consult, fresh for this call."""
    return GroupRetryState(
        policy=engine.policies[group],
        budget=engine.budgets[group],
        deadline=call.deadline,
        rng=engine.rng,
        earliest_free=lambda: engine.earliest_free(call, group),
        retry_cap=call.tier.max_retries if call.tier is not None else None,
        has_fallback=engine.has_fallback(call, group),
        retry_on=engine.retry_on,
        retry_on_max=engine.retry_on_max,
        has_candidates=lambda: _has_candidates(engine, call, group),
        spread_hold=engine.spread_hold,
        hold_slot=lambda: engine.hold_slot(call, group),
        fresh_elsewhere=lambda: overload.fresh_elsewhere(engine, call, group),
        overloaded=lambda: overload.overloaded(engine, call, group),
        holds=engine.hold_queue,
        cut_short=lambda slept: setattr(call, "next_wait", slept),
        pacing=engine.paces.enabled,
    )


def _retry_scheduled(engine: Engine, call: CallState, group: str, rs: tenacity.RetryCallState) -> None:
    """Before a retry's sleep: remember the wait for the next record and announce the retry."""
    exc = rs.outcome.exception() if rs.outcome else None
    sleep_s = rs.upcoming_sleep or 0.0
    call.next_wait = sleep_s
    if isinstance(exc, AttemptFailed):
        engine.emit(
            call,
            RetryScheduled(
                call.call_id, group, rs.attempt_number, sleep_s, exc.failure.error_class, exc.deployment_id
            ),
        )


async def _retry_group(
    engine: Engine,
    call: CallState,
    group: str,
    level: int,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
    hedge: HedgeState | None,
    first_failure: AttemptFailed,
) -> Any:
    """Attempts 2..n in ``group``: tenacity decides whether, when and how often."""
    state = _group_state(engine, call, group)

    async def before_sleep(rs: tenacity.RetryCallState) -> None:
        _retry_scheduled(engine, call, group, rs)
        if call.before_retry is not None:
            maybe = call.before_retry(rs)
            if maybe is not None:
                await maybe

    first: AttemptFailed | None = first_failure
    retrying = build_retrying(state, engine.clock, before_sleep)
    try:
        async for attempt in retrying:
            with attempt:
                if first is not None:
                    pending, first = first, None
                    raise pending
                if hedge is None:
                    return await attempts.attempt(engine, call, group, level, messages, kwargs)
                return await _hedged_attempt(engine, call, group, level, messages, kwargs, hedge)
    except AttemptFailed:
        if state.out_of_time:
            call.out_of_time = True
        raise
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


async def _hedged_attempt(
    engine: Engine,
    call: CallState,
    group: str,
    level: int,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
    hedge: HedgeState,
) -> Any:
    """Race a second request to another deployment if the first is slow; first answer wins,
    the other is cancelled (its breaker counts neither, its reservation is released)."""
    assert engine.dispatcher is not None
    hedge.on_call()
    holder: list[AttemptContext] = []
    first: asyncio.Future[Any] = asyncio.ensure_future(
        attempts.attempt(engine, call, group, level, messages, kwargs, holder=holder)
    )
    tasks: list[asyncio.Future[Any]] = [first]
    try:
        delay = min(hedge.delay(), call.deadline.remaining())
        done, _ = await asyncio.wait({first}, timeout=delay)
        if done:
            return first.result()
        picked = holder[0].picked if holder else None
        others = [d for d in engine.admissible(call, group, engine.clock.wall()) if d != picked]
        budget = engine.budgets[group]
        if not others or not budget.allows_retry() or not hedge.try_take():
            return await first
        budget.spend()
        call.report.hedged = True
        engine.emit(call, HedgeSent(call.call_id, group, delay, picked))
        exclude = frozenset({picked}) if picked else frozenset()
        second: asyncio.Future[Any] = asyncio.ensure_future(
            attempts.attempt(engine, call, group, level, messages, kwargs, exclude=exclude)
        )
        tasks.append(second)
        pending: set[asyncio.Future[Any]] = {first, second}
        errors: list[BaseException] = []
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in sorted(done, key=tasks.index):
                exc = t.exception()
                if exc is None:
                    for other in done - {t}:
                        if other.exception() is None:
                            await engine.dispatcher.discard(other.result())
                    return t.result()
                errors.append(exc)
        raise errors[0]
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        leftovers = [t for t in tasks if not t.done()]
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)


class SyncRunner:
    """The sync driver: a private event loop on a daemon thread, so blocking calls run the same
    async loop (safe from any thread). :meth:`close` ends the thread, the loop and its executor."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Every task on the private loop is held here until it ends, so a task another library
        # started there and dropped (LiteLLM's logging worker moving to the caller's loop) is
        # cancelled at close() instead of being collected pending.
        self._tasks: set[asyncio.Task[Any]] = set()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running private loop (started on first use)."""
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                loop.set_task_factory(self._hold)
                t = threading.Thread(target=_serve, args=(loop,), name="llm-resilience-sync", daemon=True)
                t.start()
                self._loop, self._thread = loop, t
            return self._loop

    def started(self) -> asyncio.AbstractEventLoop | None:
        """The private loop if it runs (never starts one)."""
        loop = self._loop
        return loop if loop is not None and not loop.is_closed() else None

    def _hold(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the private loop and wait for its result (cancelled if this thread stops)."""
        fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop())
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def close(self) -> None:
        """Stop the private loop: pending tasks are cancelled and awaited, async generators and the
        default executor shut down, the loop closed and its thread joined (idempotent)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or loop.is_closed():
            return
        if thread is not None and thread is threading.current_thread():
            loop.call_soon(loop.stop)  # closing from a callback on the loop itself: just stop it
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The private loop's thread: run until stopped, then wind everything down and close."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
