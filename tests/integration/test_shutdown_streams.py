"""A graceful shutdown and the streams being read when it comes (real HTTP, the simulator's slow
streams): they finish within the grace, then are cut with RouterClosedError, reported
``cancelled`` and counted against no deployment, sync and async alike."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from llm_resilience_plugin import ResilientRouter, get_report
from llm_resilience_plugin.errors import RouterClosedError
from llm_resilience_plugin.testing import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, MSG, deployment

SHORT = "word " * 15  # read in ~0.5 s at 0.03 s a chunk
LONG = "word " * 400  # ~20 s at 0.05 s a chunk: only a cut ends it


def _router(sim: ProviderSimulator, text: str, chunk_delay: float) -> tuple[ResilientRouter, list[Any]]:
    for d in ("a", "b"):
        sim.set_default(d, Fault.ok(text=text, chunk_delay=chunk_delay))
    router = ResilientRouter(
        model_list=[deployment(sim, "primary", d) for d in ("a", "b")],
        policy={**FAST_POLICY, "deadline": 60, "attempt_timeout": 60, "stream_idle_timeout": 30},
    )
    reports: list[Any] = []
    router.subscribe(lambda e: reports.append(e) if hasattr(e, "attempts") and e.outcome else None)
    return router, reports


def _nothing_counted(router: ResilientRouter) -> None:
    assert all(b["state"] == "closed" and b["fail_counter"] == 0 for b in router.breakers().values())


def _text(chunks: list[Any]) -> str:
    return "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)


async def _read(stream: Any, got: list[Any]) -> str:
    async for chunk in stream:
        got.append(chunk)
    return _text(got)


async def _until(cond: Any, seconds: float = 20) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


async def test_aclose_lets_async_streams_being_read_finish(sim: ProviderSimulator) -> None:
    router, reports = _router(sim, SHORT, 0.03)
    streams = [await router.acompletion(model="primary", messages=MSG, stream=True) for _ in range(4)]
    got: list[list[Any]] = [[] for _ in streams]
    readers = [asyncio.create_task(_read(s, g)) for s, g in zip(streams, got, strict=True)]
    await _until(lambda: all(len(g) >= 2 for g in got))
    started = time.monotonic()
    await router.aclose()  # the default grace: every stream reads to its end
    assert time.monotonic() - started < 8
    assert all(r.done() for r in readers)  # aclose returned once they had ended
    texts = [r.result() for r in readers]
    assert all(t.split() == SHORT.split() for t in texts), texts
    assert [r.outcome for r in reports] == ["success"] * 4
    _nothing_counted(router)
    assert sim.count() == 4


async def test_aclose_cuts_async_streams_still_read_after_the_grace(sim: ProviderSimulator) -> None:
    router, reports = _router(sim, LONG, 0.05)
    streams = [await router.acompletion(model="primary", messages=MSG, stream=True) for _ in range(4)]
    got: list[list[Any]] = [[] for _ in streams]
    readers = [asyncio.create_task(_read(s, g)) for s, g in zip(streams, got, strict=True)]
    await _until(lambda: all(len(g) >= 2 for g in got))
    started = time.monotonic()
    await router.aclose(grace=0.2)
    assert time.monotonic() - started < 5
    outcomes = await asyncio.gather(*readers, return_exceptions=True)
    assert all(isinstance(o, RouterClosedError) for o in outcomes), outcomes
    assert {get_report(o).outcome for o in outcomes} == {"cancelled"}  # type: ignore[union-attr]
    assert not any(r.cancelled() for r in readers)  # the readers' tasks are not left cancelled
    assert [r.outcome for r in reports] == ["cancelled"] * 4
    _nothing_counted(router)
    assert sim.count() == 4  # nothing recovered elsewhere


async def test_a_stream_opened_but_not_being_read_is_cut_after_the_grace(sim: ProviderSimulator) -> None:
    router, reports = _router(sim, LONG, 0.05)
    stream = await router.acompletion(model="primary", messages=MSG, stream=True)
    it = stream.__aiter__()

    async def one() -> Any:
        return await it.__anext__()

    await asyncio.create_task(one())  # another task reads it, then pauses
    started = time.monotonic()
    await router.aclose(grace=0.2)  # nobody reads it meanwhile: waited for, then cut
    assert 0.2 <= time.monotonic() - started < 5
    assert stream.report.outcome == "cancelled"
    with pytest.raises(RouterClosedError):
        await it.__anext__()
    assert [r.outcome for r in reports] == ["cancelled"]
    _nothing_counted(router)


async def test_aclose_from_the_task_reading_the_stream_does_not_wait_for_itself(
    sim: ProviderSimulator,
) -> None:
    router, _ = _router(sim, LONG, 0.05)
    stream = await router.acompletion(model="primary", messages=MSG, stream=True)
    started = time.monotonic()
    with pytest.raises(RouterClosedError):
        async for _ in stream:
            await router.aclose(grace=10)  # the reader itself closes: the stream cannot go on
    assert time.monotonic() - started < 5
    assert stream.report.outcome == "cancelled"
    _nothing_counted(router)


async def test_a_stream_cut_while_its_break_is_recovered_counts_only_the_break(
    sim: ProviderSimulator,
) -> None:
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    sim.set_default("b", Fault.slow_first_token(30))  # the continuation never comes in time
    router = ResilientRouter(
        model_list=[deployment(sim, "primary", "a"), deployment(sim, "backup", "b")],
        fallbacks=[{"primary": ["backup"]}],
        policy={**FAST_POLICY, "deadline": 60, "attempt_timeout": 60},
    )
    reports: list[Any] = []
    router.subscribe(lambda e: reports.append(e) if hasattr(e, "attempts") and e.outcome else None)
    stream = await router.acompletion(model="primary", messages=MSG, stream=True, temperature=0)
    reader = asyncio.create_task(_read(stream, []))
    await _until(lambda: sim.count() >= 2)  # a broke, the recovery waits on b
    await asyncio.sleep(0.1)
    await router.aclose(grace=0.2)
    outcome = (await asyncio.gather(reader, return_exceptions=True))[0]
    assert isinstance(outcome, RouterClosedError), outcome
    report = get_report(outcome)
    assert report is not None and report.outcome == "cancelled"
    assert [(a.deployment_id, a.outcome) for a in report.attempts] == [("a", "failure"), ("b", "cancelled")]
    assert [r.outcome for r in reports] == ["cancelled"]
    assert router.breakers()["b"]["fail_counter"] == 0  # the shutdown counted against nobody


def _read_in_thread(stream: Any) -> tuple[threading.Thread, list[Any], list[BaseException]]:
    got: list[Any] = []
    ended: list[BaseException] = []

    def read() -> None:
        try:
            for chunk in stream:
                got.append(chunk)
        except Exception as exc:  # collected: the test asserts on it
            ended.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    end = time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < end:
        time.sleep(0.01)
    return reader, got, ended


def test_close_lets_a_sync_stream_being_read_finish(sim: ProviderSimulator) -> None:
    router, reports = _router(sim, SHORT, 0.03)
    stream = router.completion(model="primary", messages=MSG, stream=True)
    reader, got, ended = _read_in_thread(stream)
    router.close()  # the default grace: the stream on the private loop reads to its end
    reader.join(10)
    assert not ended and _text(got).split() == SHORT.split()
    assert [r.outcome for r in reports] == ["success"]
    _nothing_counted(router)
    assert not [t for t in threading.enumerate() if t.name == "llm-resilience-sync"]


def test_close_from_the_thread_reading_a_sync_stream_cuts_it_at_once(sim: ProviderSimulator) -> None:
    router, reports = _router(sim, LONG, 0.05)
    stream = router.completion(model="primary", messages=MSG, stream=True)
    next(stream)
    started = time.monotonic()
    router.close(grace=10)  # this thread reads it: waiting for it would only waste the grace
    assert time.monotonic() - started < 5
    assert stream.report.outcome == "cancelled"
    with pytest.raises(RouterClosedError):
        next(stream)
    stream.close()  # closing an ended stream is a no-op, also after the router closed
    assert [r.outcome for r in reports] == ["cancelled"]
    _nothing_counted(router)
