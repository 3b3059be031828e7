"""Issue #13 item 7 end to end: a stream event or a body that cannot be decoded, a stream cut and an
Anthropic stream that ends early are reported as class ``connection`` with no HTTP status (the
simulator sent 200), in both dialects, while a real 5xx keeps its class and status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llm_resilience_plugin import ErrorClass, ResilientRouter, StreamInterruptedError, get_report
from llm_resilience_plugin.testing import Behavior, FakeClock
from llm_resilience_plugin.testing._simulator import Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, RouterFactory

LONG = [{"role": "user", "content": "tell me a long story about cats and dogs and birds"}]


async def collect(stream: Any) -> str:
    parts = []
    async for chunk in stream:
        if getattr(chunk, "choices", None) and chunk.choices[0].delta.content:  # not a StreamRestart
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def attempts(obj: Any) -> list[tuple[ErrorClass | None, int | None]]:
    report = get_report(obj)
    assert report is not None
    return [(a.error_class, a.status) for a in report.attempts]


@pytest.mark.parametrize(
    "fault",
    [Fault.malformed_chunk(after_chunks=3), Fault.stream_cut(after_chunks=3)],
    ids=["malformed-event", "cut"],
)
async def test_a_stream_broken_after_content_is_connection_with_no_status(
    make_router: RouterFactory, sim: ProviderSimulator, fault: Behavior
) -> None:
    router = make_router({"primary": ["a"]})
    sim.script("a", fault)
    # recovery off: the break itself, as the caller would see it unrecovered
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=False)
    with pytest.raises(StreamInterruptedError) as info:
        await collect(stream)
    assert info.value.partial_text
    assert [r.status for r in sim.requests()] == [200]
    assert attempts(stream) == [(ErrorClass.CONNECTION, None)]
    assert info.value.report is not None and info.value.report.error_class is ErrorClass.CONNECTION


async def test_a_garbled_stream_still_resumes_elsewhere(
    make_router: RouterFactory, sim: ProviderSimulator
) -> None:
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.script("a", Fault.malformed_chunk(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=True)
    assert (await collect(stream)).endswith(".")
    assert attempts(stream) == [(ErrorClass.CONNECTION, None), (None, None)]
    assert get_report(stream).stream_restarts == 1  # type: ignore[union-attr]


async def test_an_undecodable_body_is_connection_with_no_status(
    make_router: RouterFactory, sim: ProviderSimulator
) -> None:
    router = make_router({"primary": ["a"]})
    sim.script("a", Fault.malformed_chunk(after_chunks=2))
    resp = await router.acompletion(model="primary", messages=LONG)
    assert resp.choices[0].message.content
    assert [r.status for r in sim.requests()] == [200, 200]
    assert attempts(resp) == [(ErrorClass.CONNECTION, None), (None, None)]


@pytest.mark.parametrize(
    ("fault", "status"),
    [(Fault.server_error(500), 500), (Fault.server_error(502), 502), (Fault.server_error(503), 503)],
)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
async def test_a_real_5xx_keeps_its_class_and_status(
    make_router: RouterFactory, sim: ProviderSimulator, fault: Behavior, status: int, stream: bool
) -> None:
    router = make_router({"primary": ["a"]})
    sim.script("a", fault)
    resp = await router.acompletion(model="primary", messages=LONG, stream=stream)
    if stream:
        await collect(resp)
    assert attempts(resp) == [(ErrorClass.SERVER, status), (None, None)]


@pytest.fixture
def anthropic(sim: ProviderSimulator) -> Iterator[ResilientRouter]:
    model_list = [
        {
            "model_name": "claude",
            "litellm_params": {
                "model": "anthropic/claude-3-5-haiku-latest",
                "api_base": sim.anthropic_base("an"),
                "api_key": "sk-ant-sim-secret",
            },
            "model_info": {"id": "an"},
        }
    ]
    router = ResilientRouter(model_list=model_list, policy=FAST_POLICY, clock=FakeClock(), seed=1)
    yield router
    router.close()


@pytest.mark.parametrize(
    "fault",
    [
        Fault.stream_cut(after_chunks=3),
        Fault.malformed_chunk(after_chunks=2, content=False),
        Fault.malformed_chunk(after_chunks=3),
    ],
    ids=["cut", "malformed-event", "malformed-text-event"],
)
async def test_an_anthropic_stream_broken_after_its_200_is_connection_with_no_status(
    anthropic: ResilientRouter, sim: ProviderSimulator, fault: Behavior
) -> None:
    sim.script("an", fault)
    stream = await anthropic.acompletion(model="claude", messages=LONG, stream=True, recover_streams=False)
    try:
        await collect(stream)
    except StreamInterruptedError:
        pass
    assert sim.requests("an")[0].status == 200
    assert attempts(stream)[0] == (ErrorClass.CONNECTION, None)


async def test_through_the_router_too_a_malformed_event_after_the_200_has_no_status(
    sim: ProviderSimulator,
) -> None:
    """The Router wraps the break in an APIConnectionError (500) around a MidStreamFallbackError."""
    model_list = [
        {
            "model_name": "claude",
            "litellm_params": {
                "model": "anthropic/claude-3-5-haiku-latest",
                "api_base": sim.anthropic_base("an"),
                "api_key": "sk-ant-sim-secret",
            },
            "model_info": {"id": "an"},
        }
    ]
    router = ResilientRouter(
        model_list=model_list, policy={**FAST_POLICY, "dispatch": "router"}, clock=FakeClock(), seed=1
    )
    try:
        sim.script("an", Fault.malformed_chunk(after_chunks=2, content=False))
        stream = await router.acompletion(model="claude", messages=LONG, stream=True, recover_streams=False)
        with pytest.raises(StreamInterruptedError):
            await collect(stream)
        assert sim.requests("an")[0].status == 200
        assert attempts(stream)[0] == (ErrorClass.CONNECTION, None)
    finally:
        router.close()


async def test_an_anthropic_undecodable_body_is_connection_and_529_stays_server(
    anthropic: ResilientRouter, sim: ProviderSimulator
) -> None:
    sim.script("an", Fault.malformed_chunk(after_chunks=2))
    resp = await anthropic.acompletion(model="claude", messages=LONG)
    assert attempts(resp) == [(ErrorClass.CONNECTION, None), (None, None)]
    sim.script("an", Fault.overloaded())
    stream = await anthropic.acompletion(model="claude", messages=LONG, stream=True)
    await collect(stream)
    assert attempts(stream) == [(ErrorClass.SERVER, 529), (None, None)]
