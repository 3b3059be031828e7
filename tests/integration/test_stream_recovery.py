"""A stream broken after content resumes on another route: another deployment of the group, then
the fallback chain, as often as the policy's cap and the deadline allow."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llm_resilience_plugin import StreamInterruptedError, get_report
from llm_resilience_plugin.events import StreamRestart
from llm_resilience_plugin.testing import Fault
from tests.conftest import RouterFactory

LONG = [{"role": "user", "content": "tell me a long story about cats and dogs and birds"}]
STORY = "Once upon a time a cat, a dog and a bird shared one garden and never once quarrelled."


async def read(stream: Any) -> tuple[str, list[StreamRestart], str | None]:
    """The text the caller ends up with (a restart marker discards what came before it)."""
    parts: list[str] = []
    markers: list[StreamRestart] = []
    finish = None
    async for item in stream:
        if isinstance(item, StreamRestart):
            markers.append(item)
            if item.mode == "restart":
                parts.clear()
            continue
        for choice in item.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(parts), markers, finish


async def test_a_cut_stream_resumes_on_the_fallback_when_the_group_has_no_other_deployment(
    make_router: RouterFactory, sim
) -> None:
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=True)
    text, markers, finish = await read(stream)
    assert text.startswith("Hello from b") and finish == "stop"
    assert [m.mode for m in markers] == ["restart"]
    report = get_report(stream)
    assert report is not None and report.stream_restarts == 1 and report.outcome == "success"
    assert sim.count("a") == 1  # never back to the deployment that just broke


async def test_a_cut_stream_resumes_on_another_deployment_of_the_same_group_first(
    make_router: RouterFactory, sim
) -> None:
    router = make_router({"primary": ["a", "c"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    sim.set_default("c", Fault.stream_cut(after_chunks=3))
    first = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=True)
    text, markers, _ = await read(first)
    # a and c both break after content: each is tried once, then the fallback answers.
    assert text.startswith("Hello from b")
    assert len(markers) == 2 and sim.count("a") == 1 and sim.count("c") == 1
    assert get_report(first).stream_restarts == 2  # type: ignore[union-attr]


async def test_the_restart_cap_bounds_how_often_a_stream_resumes(make_router: RouterFactory, sim) -> None:
    router = make_router(
        {"primary": ["a", "c"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"max_stream_restarts": 1},
    )
    for dep in ("a", "c", "b"):
        sim.set_default(dep, Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=True)
    with pytest.raises(StreamInterruptedError):
        await read(stream)
    report = get_report(stream)
    assert report is not None and report.stream_restarts == 1 and report.outcome == "failure"
    assert report.total_latency_s is not None and report.total_latency_s > 0


async def test_a_restart_that_repeats_the_delivered_text_goes_on_seamlessly(
    make_router: RouterFactory, sim
) -> None:
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    # A deterministic model: the same answer from either deployment; the primary breaks mid-way.
    sim.script("a", dataclasses.replace(Fault.stream_cut(after_chunks=4), text=STORY))
    sim.set_default("b", Fault.ok(text=STORY))
    seen: list[Any] = []
    stream = await router.acompletion(
        model="primary", messages=LONG, stream=True, recover_streams=True, listener=seen.append
    )
    text, markers, finish = await read(stream)
    assert text == STORY and finish == "stop"
    assert markers == []  # nothing in-band to handle: the caller's text simply goes on
    assert [e.mode for e in seen if isinstance(e, StreamRestart)] == ["resume"]


@pytest.mark.parametrize(
    "fault",
    [Fault.stream_stall(after_chunks=3, seconds=5), Fault.malformed_chunk(after_chunks=3)],
    ids=["stall", "malformed-event"],
)
async def test_a_stalled_or_garbled_stream_resumes_elsewhere(make_router: RouterFactory, sim, fault) -> None:
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"stream_idle_timeout": 0.3},
    )
    sim.script("a", fault)
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=True)
    text, markers, finish = await read(stream)
    assert text.startswith("Hello from b") and finish == "stop" and len(markers) == 1


async def test_without_the_switch_a_chunk_consumer_gets_a_typed_error_with_the_partial_text(
    make_router: RouterFactory, sim
) -> None:
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    with pytest.raises(StreamInterruptedError) as info:
        await read(stream)
    assert info.value.partial_text
    report = get_report(stream)
    assert (
        report is not None
        and report.total_latency_s is not None
        and report.total_latency_s >= (report.ttft_s or 0)
    )
