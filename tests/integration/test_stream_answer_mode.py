"""``recover_streams="answer"``: a stream broken after content is answered again without
streaming inside the same call (one deadline, one report, the broken deployment avoided); the
stream ends with a ``StreamRestart(mode="answer")`` marker holding the whole answer."""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience_plugin import ConfigError, StreamInterruptedError, get_report
from llm_resilience_plugin.events import CallReport, StreamRestart
from llm_resilience_plugin.testing import Fault
from tests.conftest import RouterFactory

LONG = [{"role": "user", "content": "tell me a long story about cats and dogs and birds"}]


async def _drain(stream: Any) -> tuple[list[Any], list[StreamRestart]]:
    chunks: list[Any] = []
    markers: list[StreamRestart] = []
    async for item in stream:
        (markers if isinstance(item, StreamRestart) else chunks).append(item)
    return chunks, markers


async def test_a_cut_stream_is_answered_whole_in_the_same_call(make_router: RouterFactory, sim) -> None:
    seen: list[Any] = []
    published: list[tuple[str, int, Any]] = []

    def listen(event: Any) -> None:
        seen.append(event)
        if isinstance(event, CallReport):  # what the report says at the moment it is published
            published.append(("CallReport", event.stream_restarts, event.outcome))

    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(
        model="primary", messages=LONG, stream=True, recover_streams="answer", listener=listen
    )
    chunks, markers = await _drain(stream)
    assert chunks  # the broken stream's content reached the caller before it broke
    assert [m.mode for m in markers] == ["answer"]
    answer = markers[0].response
    assert answer.choices[0].message.content.startswith("Hello from b")
    assert markers[0].discarded_text and "response" not in markers[0].to_dict()
    # One call: the answer carries the stream's own report, published once, as a success.
    report = get_report(answer)
    assert report is stream.report and report.outcome == "success" and report.stream_restarts == 1
    assert [(a.deployment_id, a.outcome) for a in report.attempts] == [("a", "failure"), ("b", "success")]
    assert [e for e in seen if isinstance(e, CallReport)] == [report]
    # Published once, after the marker, already counting the restart (exporters read it then).
    assert [type(e).__name__ for e in seen if isinstance(e, CallReport | StreamRestart)] == [
        "StreamRestart",
        "CallReport",
    ]
    assert published[-1] == ("CallReport", 1, "success")
    assert [r.stream for r in sim.requests()] == [True, False]  # the answer was not streamed
    assert sim.count("a") == 1  # never back to the deployment that just broke


async def test_no_route_left_surfaces_the_break_with_one_failed_report(
    make_router: RouterFactory, sim
) -> None:
    seen: list[Any] = []
    router = make_router({"primary": ["a"]})
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(
        model="primary", messages=LONG, stream=True, recover_streams="answer", listener=seen.append
    )
    with pytest.raises(StreamInterruptedError) as info:
        await _drain(stream)
    assert info.value.partial_text
    reports = [e for e in seen if isinstance(e, CallReport)]
    assert len(reports) == 1 and reports[0].outcome == "failure"
    assert sim.count("a") == 1


def test_sync_stream_answer_mode(make_router: RouterFactory, sim) -> None:
    router = make_router({"primary": ["a", "c"]})
    sim.script("a", Fault.stream_cut(after_chunks=2))
    sim.script("c", Fault.stream_cut(after_chunks=2))
    stream = router.completion(model="primary", messages=LONG, stream=True, recover_streams="answer")
    items = list(stream)
    marker = items[-1]
    assert isinstance(marker, StreamRestart) and marker.mode == "answer"
    assert marker.response.choices[0].message.content.startswith("Hello from")
    assert get_report(marker.response).stream_restarts == 1  # type: ignore[union-attr]


async def test_recover_streams_must_be_a_known_value(make_router: RouterFactory, sim) -> None:
    router = make_router({"primary": ["a"]})
    with pytest.raises(ConfigError, match="recover_streams"):
        await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams="whole")
    assert sim.count() == 0


@pytest.mark.parametrize("mode", ["answer", True])
async def test_a_caller_leaving_during_the_recovery_gets_its_report_published(
    make_router: RouterFactory, sim, mode: Any
) -> None:
    import asyncio

    seen: list[Any] = []
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.script("a", Fault.stream_cut(after_chunks=3))
    sim.set_default("b", Fault.ok(latency=2.0))
    stream = await router.acompletion(
        model="primary", messages=LONG, stream=True, recover_streams=mode, listener=seen.append
    )
    reader = asyncio.ensure_future(_drain(stream))
    await asyncio.sleep(0.5)  # the break happened; the recovery waits on the slow backup
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert [r.outcome for r in seen if isinstance(r, CallReport)] == ["cancelled"]
