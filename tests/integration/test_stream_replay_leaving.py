"""Sync streams through a verified replay (chat, text completion, Responses; a tool call is never
joined), and a caller leaving while a replay is held back (its text not yet covering what the
caller saw), sync and async: the replay is closed, its connection dropped, its cost reservation
settled, the call's report published once as cancelled, no task left behind."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from llm_resilience_plugin import get_report
from llm_resilience_plugin.cost._guard import Budget, CostGuard
from llm_resilience_plugin.events import CallReport
from llm_resilience_plugin.testing import Fault, ProviderSimulator
from tests.integration.test_stream_seamless import LONG, SAME, STORY, breaker_counts, breaks, cut, make

SHOWN = "Once upon a time "  # the four words the broken stream delivered


def _slow_replay(sim: ProviderSimulator) -> None:
    """a breaks after four words; b replays the same story slowly (0.3 s a word), so the
    replay is held back for about a second before its text covers them."""
    sim.script("a", cut(4, STORY))
    sim.set_default("b", Fault.ok(text=STORY, chunk_delay=0.3))


def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


async def _async_until(check: Callable[[], bool], within: float = 5.0) -> None:
    end = time.monotonic() + within
    while not check():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


def _settled(sim: ProviderSimulator, guard: CostGuard, router: Any, seen: list[Any]) -> None:
    """What a caller leaving during the hold must leave behind."""
    _until(lambda: all(r.finished_at is not None for r in sim.requests("b")))  # connection dropped
    (replay,) = sim.requests("b")
    assert (
        replay.finished_at is not None and replay.finished_at - replay.started_at < 3.0
    )  # not read to its end (~5 s)
    reports = [e for e in seen if isinstance(e, CallReport)]
    assert [r.outcome for r in reports] == ["cancelled"]  # published once
    (usage,) = [u for u in guard.report().budgets if u.budget == "daily"]
    assert usage.reserved == 0 and usage.spent > 0  # the broken stream and the replay were sent
    assert breaker_counts(router) == {"a": 1, "b": 0}  # leaving says nothing about b


def _ours_pending() -> list[asyncio.Task[Any]]:
    return [
        t
        for t in asyncio.all_tasks()
        if t is not asyncio.current_task()
        and not t.done()
        and "llm_resilience_plugin" in getattr(t.get_coro(), "cr_code", t.get_coro().__class__).__repr__()
    ]


# -- the verified replay itself ---------------------------------------------------------------------


def test_a_sync_stream_replays_on_the_same_route_and_verifies_it(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}})
    sim.script("a", cut(4, STORY))
    sim.set_default("a", Fault.ok(text=STORY))
    stream = router.completion(model="primary", messages=LONG, stream=True, **SAME)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == STORY
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1  # no second opening
    assert breaks(stream) == [("replayed", "a", "a")]
    assert get_report(stream).outcome == "success"  # type: ignore[union-attr]


def test_a_sync_stream_drops_a_diverging_replay_and_moves_on(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}})
    sim.script("a", cut(4, STORY))
    sim.set_default("a", Fault.ok(text=STORY))
    sim.set_default("b", Fault.ok(text="Once there was a fox."))
    stream = router.completion(model="primary", messages=LONG, stream=True, **SAME)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == STORY
    assert breaks(stream) == [("diverged", "a", "b"), ("replayed", "a", "a")]


# -- leaving while a replay is held back --------------------------------------------------------------


async def test_cancelling_the_task_while_a_replay_is_held_back(sim, routers) -> None:
    guard = CostGuard([Budget.daily(1.0)])
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}}, guards=[guard])
    _slow_replay(sim)
    seen: list[Any] = []
    stream = await router.acompletion(
        model="primary", messages=LONG, stream=True, listener=seen.append, **SAME
    )
    shown = ""

    async def consume() -> None:
        nonlocal shown
        async for chunk in stream:
            for choice in chunk.choices:
                shown += choice.delta.content or ""

    task = asyncio.create_task(consume())
    await _async_until(lambda: sim.count("b") == 1)
    await asyncio.sleep(0.4)  # b has sent a word or two: not yet the four shown
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert shown == SHOWN  # nothing of the replay reached the caller
    await asyncio.to_thread(_settled, sim, guard, router, seen)
    assert _ours_pending() == []


async def test_a_deadline_of_the_caller_while_a_replay_is_held_back(sim, routers) -> None:
    guard = CostGuard([Budget.daily(1.0)])
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}}, guards=[guard])
    _slow_replay(sim)
    seen: list[Any] = []
    stream = await router.acompletion(
        model="primary", messages=LONG, stream=True, listener=seen.append, **SAME
    )
    it = stream.__aiter__()
    shown = ""
    while len(shown) < len(SHOWN):
        chunk = await it.__anext__()
        shown += chunk.choices[0].delta.content or ""
    with pytest.raises(TimeoutError):  # the break, the hold: longer than the caller waits
        await asyncio.wait_for(it.__anext__(), 0.6)
    await it.aclose()  # type: ignore[attr-defined]
    await stream.aclose()
    await asyncio.to_thread(_settled, sim, guard, router, seen)
    assert _ours_pending() == []


async def test_closing_the_stream_from_another_task_while_a_replay_is_held_back(sim, routers) -> None:
    guard = CostGuard([Budget.daily(1.0)])
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}}, guards=[guard])
    _slow_replay(sim)
    seen: list[Any] = []
    stream = await router.acompletion(
        model="primary", messages=LONG, stream=True, listener=seen.append, **SAME
    )
    shown = ""

    async def consume() -> None:
        nonlocal shown
        async for chunk in stream:
            for choice in chunk.choices:
                shown += choice.delta.content or ""

    task = asyncio.create_task(consume())
    await _async_until(lambda: sim.count("b") == 1)
    await asyncio.sleep(0.4)
    await stream.aclose()
    await asyncio.wait_for(task, 2.0)  # the reader's loop just ends: the caller closed the stream
    assert shown == SHOWN
    await asyncio.to_thread(_settled, sim, guard, router, seen)
    assert _ours_pending() == []


def test_closing_a_sync_stream_from_another_thread_while_a_replay_is_held_back(sim, routers) -> None:
    guard = CostGuard([Budget.daily(1.0)])
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}}, guards=[guard])
    _slow_replay(sim)
    seen: list[Any] = []
    stream = router.completion(model="primary", messages=LONG, stream=True, listener=seen.append, **SAME)
    shown: list[str] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for chunk in stream:
                shown.extend(choice.delta.content or "" for choice in chunk.choices)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    reader = threading.Thread(target=consume)
    reader.start()
    _until(lambda: sim.count("b") == 1)
    time.sleep(0.4)
    stream.close()
    reader.join(2.0)
    assert not reader.is_alive() and errors == []
    assert "".join(shown) == SHOWN
    _settled(sim, guard, router, seen)


def test_sync_text_completion_and_responses_streams_are_replayed_and_verified(sim, routers) -> None:
    from tests.integration.test_stream_seamless import _ops_router

    text_router = _ops_router(sim, routers, "openai/gpt-3.5-turbo-instruct", {"mode": "completion"})
    for dep in ("a", "b"):
        sim.set_default(dep, Fault.ok(text=STORY))
        sim.script(dep, cut(4, STORY))
    stream = text_router.text_completion("g", "tell me a story", stream=True, **SAME)
    assert "".join(c.choices[0].text or "" for c in stream if c.choices) == STORY
    assert {b[0] for b in breaks(stream)} == {"replayed"}

    sim.reset()
    responses_router = _ops_router(sim, routers, "openai/gpt-4o-mini", {"mode": "responses"})
    for dep in ("a", "b"):
        sim.set_default(dep, Fault.ok(text=STORY))
        sim.script(dep, cut(4, STORY))
    rstream = responses_router.responses("g", "tell me a story", stream=True, **SAME)
    events = list(rstream)
    assert {b[0] for b in breaks(rstream)} == {"replayed"}
    kinds = [str(getattr(e.type, "value", e.type)) for e in events]
    assert (
        "".join(e.delta for e, k in zip(events, kinds, strict=True) if k == "response.output_text.delta")
        == STORY
    )
    assert kinds.count("response.created") == 1


def test_a_sync_tool_call_stream_is_never_joined_with_another_answer(sim, routers) -> None:
    from llm_resilience_plugin import StreamInterruptedError
    from tests.conftest import WEATHER_TOOLS

    router = make(sim, routers, {"primary": {"a": True}, "backup": {"b": True}})
    sim.script("a", Fault.stream_cut(after_chunks=2))
    ask = [{"role": "user", "content": "what is the weather in Paris"}]
    stream = router.completion(model="primary", messages=ask, stream=True, tools=WEATHER_TOOLS, **SAME)
    args = ""
    with pytest.raises(StreamInterruptedError) as info:
        for chunk in stream:
            for call in chunk.choices[0].delta.tool_calls or []:
                args += call.function.arguments or ""
    whole = info.value.replacement.choices[0].message.tool_calls[0].function.arguments
    assert args and whole.startswith("{") and whole.endswith("}") and whole != args
    assert [r.stream for r in sim.requests("b")] == [False]  # asked whole, never continued


async def test_closing_the_stream_while_the_recovery_is_still_connecting(sim, routers) -> None:
    # The walk to b is not interrupted: when b's stream arrives (its headers 0.8 s late), it is
    # closed at once and the reader's loop ends; the call is published as cancelled.
    guard = CostGuard([Budget.daily(1.0)])
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}}, guards=[guard])
    sim.script("a", cut(4, STORY))
    sim.set_default("b", Fault.ok(text=STORY, latency=0.8, chunk_delay=0.3))
    seen: list[Any] = []
    stream = await router.acompletion(
        model="primary", messages=LONG, stream=True, listener=seen.append, **SAME
    )
    shown = ""

    async def consume() -> None:
        nonlocal shown
        async for chunk in stream:
            for choice in chunk.choices:
                shown += choice.delta.content or ""

    task = asyncio.create_task(consume())
    await _async_until(lambda: sim.count("b") == 1)
    await stream.aclose()
    await asyncio.wait_for(task, 3.0)
    assert shown == SHOWN
    await asyncio.to_thread(_settled, sim, guard, router, seen)
    assert _ours_pending() == []
