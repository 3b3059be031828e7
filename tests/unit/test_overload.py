"""A 429 storm of our own making against a rate-limit incident (issue #13, item 4): a hold that
refused several of our requests while answering others is our own load, so nobody queues for it
and those already waiting are woken to fail over; a deployment refusing everything still keeps a
call on the group asked for.
And a retry that moves to another healthy deployment of the group takes no backoff sleep.

These are the Retry-After hold rules in force with ``pacing: {enabled: false}``; with pacing on
(the default) a 429 goes to the deployment's pace (tests/unit/test_pacing.py)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import httpx
import litellm

from llm_resilience_plugin._engine.attempt import AttemptContext
from llm_resilience_plugin._engine.clock import Clock, Deadline
from llm_resilience_plugin._engine.drivers import walk_routes
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.holds import HoldQueue
from llm_resilience_plugin._engine.overload import fresh_elsewhere, overloaded
from llm_resilience_plugin._engine.retry import GroupRetryState, hold_sleep, hold_sleep_blocking
from llm_resilience_plugin.errors import ErrorClass, Failure
from tests.unit.test_engine_core import MSG, _call, _err
from tests.unit.test_engine_core import _engine as _paced_engine


def _engine(scripts: dict[str, list[tuple[str, Any]]], **policy: Any) -> Any:
    """An engine on the hold rules (pacing off)."""
    return _paced_engine(scripts, pacing={"enabled": False}, **policy)


def _refuse(engine: Engine, dep: str, seconds: float = 1.0, caller: str = "c1") -> None:
    """A request of call ``caller`` to ``dep`` answered 429 with ``Retry-After: seconds``."""
    call = _call(engine)
    call.call_id = caller
    actx = AttemptContext(engine=engine, call=call, group="primary")
    actx.pick(dep)
    actx.sent = True
    exc = litellm.RateLimitError("slow down", llm_provider="openai", model="m")
    failure = Failure(ErrorClass.RATE_LIMIT, 429, "slow down", seconds, exc)
    engine.attempt_failed(call, "primary", 0, actx, failure, engine.clock.wall(), 0.01, 0.0)


def _rate_limited(seconds: float) -> Exception:
    request = httpx.Request("POST", "http://sim/v1/chat/completions")
    response = httpx.Response(429, headers={"retry-after": str(seconds)}, request=request)
    return litellm.RateLimitError("slow down", llm_provider="openai", model="m", response=response)


def test_a_hold_refusing_several_while_answering_some_is_saturated_and_closes_its_queue() -> None:
    q = HoldQueue()
    q.held("a", 100.0, 1.0)
    q.held("a", 100.05, 1.0)  # a second request of ours, in flight together, refused
    assert not q.saturated("a")  # nothing answered: an incident met by concurrent calls
    q.answered("a", 100.2)  # but it serves others of ours meanwhile: our own load
    assert q.saturated("a")
    assert q.try_wait([("a", 0.8)], 100.2) is None  # nobody queues for a saturated hold
    q.held("a", 102.0, 1.0)  # a later hold starts afresh
    assert not q.saturated("a")
    assert q.try_wait([("a", 1.0)], 102.0) == 1.0


def test_one_refusal_while_answering_keeps_the_queue_sized_by_the_answers() -> None:
    q = HoldQueue()
    q.held("a", 100.0, 1.0)
    for t in (100.1, 100.2):
        q.answered("a", t)
    assert not q.saturated("a")  # mild overload: the few waiting fit in when it lifts
    assert [q.try_wait([("a", 0.7)], 100.3) for _ in range(3)] == [0.7, 0.7, None]


async def test_waiting_calls_look_again_at_each_refusal_and_when_a_hold_turns_saturated() -> None:
    q = HoldQueue()
    q.held("a", 0.0, 1.0)
    fut = q.wakeup()
    q.answered("a", -0.1)  # an answer from before the hold: nothing to look at again
    await asyncio.sleep(0)
    assert not fut.done()
    q.held("a", 0.01, 1.0)  # another refusal: the waiting calls check whether it is our load
    await asyncio.wait_for(fut, 1.0)
    q.forget(fut)
    again = q.wakeup()
    q.answered("a", 0.2)  # saturated: they look again
    await asyncio.wait_for(again, 1.0)
    q.forget(again)
    assert q.refused_first("a") is None  # refusals without a caller named
    q.held("b", 0.0, 1.0, "call-1")
    q.held("b", 0.1, 1.0, "call-2")
    assert q.refused_first("b") == "call-1"


def test_a_group_refusing_together_with_several_refused_at_once_is_our_load() -> None:
    engine, _, _ = _engine({})
    call = _call(engine)
    for dep in ("a", "b"):
        _refuse(engine, dep)
    assert not overloaded(engine, call, "primary")  # one call refused by each in turn: no load
    _refuse(engine, "b")
    assert overloaded(engine, call, "primary")  # the whole group refusing, b several at once
    other, _, _ = _engine({})
    _refuse(other, "a", caller="x")
    _refuse(other, "b", caller="y")
    assert overloaded(other, call, "primary")  # two of our calls refused at once by the group


async def test_a_storm_of_our_own_fails_over_at_once_instead_of_waiting() -> None:
    engine, disp, clock = _engine({"primary": [], "backup": [("c", "from backup")]})
    for dep in ("a", "b", "a", "b"):  # each refused two of our concurrent requests
        _refuse(engine, dep)
    for dep in ("a", "b"):  # while answering others of ours
        engine.hold_queue.answered(dep, engine.clock.wall())
    call = _call(engine)
    assert overloaded(engine, call, "primary")
    resp = await walk_routes(engine, call, "primary", MSG, {})
    assert resp.choices[0].message.content == "from backup"
    assert disp.sent == [("backup", "c")]  # nothing sent to a held deployment
    assert sum(clock.slept) < 0.1  # and no Retry-After waited out


async def test_a_rate_limit_incident_is_still_waited_out_on_the_group_asked_for() -> None:
    engine, _, clock = _engine({"primary": [("a", "from a")], "backup": [("c", "from backup")]})
    for dep in ("a", "b"):  # one of ours refused by each, none answered
        _refuse(engine, dep)
    call = _call(engine)
    assert not overloaded(engine, call, "primary")
    resp = await walk_routes(engine, call, "primary", MSG, {})
    assert resp.choices[0].message.content == "from a"
    assert call.report.served_group == "primary"
    assert max(clock.slept) >= 0.9  # the short hold, waited out


class _Forever(Clock):
    """A clock whose sleeps never end on their own (only a release ends the wait)."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.Event().wait()


def _waiting_on_a(
    engine: Engine, clock: Clock, holds: HoldQueue, hold: float, cut_short: Any
) -> GroupRetryState:
    """A call's retry state as it starts waiting out ``hold`` seconds of deployment a's hold,
    released early when a turns out to be our own load."""
    return GroupRetryState(
        policy=engine.policies["primary"],
        budget=engine.budgets["primary"],
        deadline=Deadline.after(clock, hold * 2 + 10),
        rng=random.Random(1),
        earliest_free=lambda: hold,
        overloaded=lambda: holds.saturated("a"),
        holds=holds,
        waiting_hold=True,
        cut_short=cut_short,
    )


async def test_a_call_waiting_out_a_hold_is_released_when_it_turns_out_to_be_our_load() -> None:
    engine, _, _ = _engine({})
    clock = _Forever()
    holds = HoldQueue()
    slept: list[float] = []
    holds.held("a", clock.wall(), 1.0)
    state = _waiting_on_a(engine, clock, holds, 1.0, slept.append)
    waiting = asyncio.ensure_future(hold_sleep(state, clock, 1.0))
    await asyncio.sleep(0)
    holds.held("a", clock.wall(), 1.0)  # a second refusal in the same hold
    await asyncio.sleep(0)
    assert not waiting.done()
    holds.answered("a", clock.wall())  # and an answer to another request of ours
    await asyncio.wait_for(waiting, 1.0)
    assert len(slept) == 1 and slept[0] < 1.0  # the record says how long it really waited
    assert not state.waiting_hold


def test_a_blocking_call_waiting_out_a_hold_is_released_when_it_turns_out_to_be_our_load() -> None:
    """The sync twin: a caller sleeping out a hold on its own thread is woken the same way."""
    engine, _, _ = _engine({})
    clock = Clock()
    holds = HoldQueue()
    slept: list[float] = []
    holds.held("a", clock.wall(), 30.0)
    state = _waiting_on_a(engine, clock, holds, 30.0, slept.append)
    sleeper = threading.Thread(target=hold_sleep_blocking, args=(state, clock, 30.0))
    t0 = time.monotonic()
    sleeper.start()
    while not holds.sleepers:  # the sleeper is waiting on its event
        time.sleep(0.001)
    holds.held("a", clock.wall(), 30.0)  # a second refusal: crowded, not yet our load
    holds.answered("a", clock.wall())  # and an answer to another request of ours: saturated
    sleeper.join(5.0)
    assert not sleeper.is_alive()
    assert time.monotonic() - t0 < 5.0  # not the 30 s hold
    assert len(slept) == 1 and slept[0] < 5.0
    assert not holds.sleepers and not state.waiting_hold


def test_a_blocking_hold_wait_that_is_not_our_load_sleeps_it_out() -> None:
    """A wake that leaves the group not overloaded (one refusal, no answer) keeps the caller waiting."""
    engine, _, _ = _engine({})
    clock = Clock()
    holds = HoldQueue()
    holds.held("a", clock.wall(), 0.2)
    cut: list[float] = []
    state = _waiting_on_a(engine, clock, holds, 0.2, cut.append)
    sleeper = threading.Thread(target=hold_sleep_blocking, args=(state, clock, 0.2))
    t0 = time.monotonic()
    sleeper.start()
    while not holds.sleepers:
        time.sleep(0.001)
    holds.held("b", clock.wall(), 1.0)  # another deployment's refusal wakes it: not our load
    sleeper.join(5.0)
    assert not sleeper.is_alive()
    assert time.monotonic() - t0 >= 0.19 and not cut


async def test_a_retry_moving_to_another_healthy_deployment_takes_no_backoff() -> None:
    engine, _, clock = _engine({"primary": [("a", _err(503)), ("b", "from b")]})
    call = _call(engine)
    assert fresh_elsewhere(engine, call, "primary")
    resp = await walk_routes(engine, call, "primary", MSG, {})
    assert resp.choices[0].message.content == "from b"
    assert clock.slept == [0.0]
    assert [a.wait_before_s for a in call.report.attempts] == [0.0, 0.0]


async def test_a_retry_on_a_deployment_that_failed_this_call_still_backs_off() -> None:
    engine, _, clock = _engine(
        {"primary": [("a", _err(503)), ("b", _err(503)), ("a", "from a")]},
        backoff={"initial": 0.2, "maximum": 0.4},
    )
    call = _call(engine)
    resp: Any = await walk_routes(engine, call, "primary", MSG, {})
    assert resp.choices[0].message.content == "from a"
    assert clock.slept[0] == 0.0 and clock.slept[1] > 0.0  # a -> b at once; b -> a backs off
    assert not fresh_elsewhere(engine, call, "primary")


async def test_a_429_from_the_simulator_shape_carries_its_hold() -> None:
    engine, _, clock = _engine({"primary": [("a", _rate_limited(1)), ("b", "from b")], "backup": []})
    call = _call(engine)
    resp = await walk_routes(engine, call, "primary", MSG, {})
    assert resp.choices[0].message.content == "from b"  # the sibling, at once: it holds nothing
    assert clock.slept == [0.0]
    assert engine.breakers["a"].held_for() > 0


async def test_a_429_from_a_crowded_hold_fails_over_instead_of_trying_the_sibling() -> None:
    engine, disp, clock = _engine(
        {"primary": [("a", _rate_limited(1)), ("b", "from b")], "backup": [("c", "from backup")]}
    )
    _refuse(engine, "a")  # another call's request, in flight with this one, refused first
    call = _call(engine)
    resp = await walk_routes(engine, call, "primary", MSG, {})
    assert resp.choices[0].message.content == "from backup"  # b has the same share of our load
    assert disp.sent == [("primary", "a"), ("backup", "c")]
    assert clock.slept == []
