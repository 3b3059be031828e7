"""Streaming through the router: failures before the first chunk are retried or failed over;
after it, a typed error carries the partial text; truncated answers are never a success."""

from __future__ import annotations

import pytest

from llm_resilience_plugin import ErrorClass, StreamInterruptedError, get_report
from llm_resilience_plugin.testing import Clock
from llm_resilience_plugin.testing._simulator import Fault
from tests.conftest import MSG, RouterFactory
from tests.integration._parity import usage_only

LONG = [{"role": "user", "content": "tell me a long story about cats and dogs and birds"}]


async def collect(stream) -> str:
    parts = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


async def test_stream_success_reports_usage_and_deployment(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text = await collect(stream)
    assert text.startswith("Hello from a.")
    assert stream.usage and stream.usage["completion_tokens"] > 0
    rep = get_report(stream)
    assert rep is not None and rep.outcome == "success" and rep.deployment_id == "a"
    assert rep.usage == stream.usage and rep.ttft_s is not None
    assert sim.requests("a")[0].body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("fault", [Fault.server_error(500), Fault.reset(), Fault.rate_limit()])
async def test_failure_before_first_chunk_is_retried_transparently(make_router: RouterFactory, sim, fault):
    router = make_router({"primary": ["a"]})
    sim.script("a", fault)
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    assert (await collect(stream)).startswith("Hello from a.")
    assert sim.count("a") == 2


async def test_slow_first_token_fails_over_before_any_content(make_router: RouterFactory, sim):
    router = make_router(
        {"primary": ["a"], "backup": ["b"]},
        fallbacks=[{"primary": ["backup"]}],
        policy={"attempt_timeout": 5, "first_chunk_timeout": 0.4},
        clock=Clock(),
    )
    sim.set_default("a", Fault.slow_first_token(3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    assert (await collect(stream)).startswith("Hello from b.")
    rep = get_report(stream)
    assert rep is not None and rep.served_group == "backup"
    assert rep.attempts[0].error_class is ErrorClass.TIMEOUT
    assert sim.count("a") == 1


@pytest.mark.parametrize("fault", [Fault.stream_cut(after_chunks=3), Fault.malformed_chunk(after_chunks=3)])
async def test_a_break_nothing_can_continue_raises_the_typed_error_with_a_replacement(
    make_router: RouterFactory, sim, fault
):
    # The default: no deployment takes a prefill (gpt-4o-mini), the request samples (no
    # temperature 0, no seed) so a replay would not reproduce: the answer is had again without
    # streaming and handed over in the typed error - never spliced onto the partial one.
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.set_default("a", fault)
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    with pytest.raises(StreamInterruptedError) as info:
        await collect(stream)
    err = info.value
    assert err.partial_text.startswith("Hello")
    assert "Hello from a." in err.partial_text or err.partial_text == "Hello "
    assert err.cause is not None
    assert err.replacement.choices[0].message.content.startswith("Hello from b.")
    assert [r.stream for r in sim.requests("b")] == [False]
    assert err.report is not None and err.report.outcome == "failure"
    assert [b.end for b in err.report.stream_breaks] == ["given_up"]
    assert err.report.stream_breaks[0].deployment_id == "b"
    assert router.breakers()["a"]["fail_counter"] == 1


@pytest.mark.parametrize("fault", [Fault.stream_cut(after_chunks=3), Fault.malformed_chunk(after_chunks=3)])
async def test_with_recovery_off_a_break_raises_the_typed_error_at_once(
    make_router: RouterFactory, sim, fault
):
    router = make_router({"primary": ["a"], "backup": ["b"]}, fallbacks=[{"primary": ["backup"]}])
    sim.set_default("a", fault)
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=False)
    with pytest.raises(StreamInterruptedError) as info:
        await collect(stream)
    assert info.value.partial_text.startswith("Hello") and info.value.replacement is None
    assert sim.count("b") == 0  # nothing asked again
    assert info.value.report is not None and info.value.report.outcome == "failure"


async def test_stall_mid_stream_is_detected(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]}, policy={"attempt_timeout": 0.5}, clock=Clock())
    sim.set_default("a", Fault.stream_stall(after_chunks=3, seconds=5))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    with pytest.raises(StreamInterruptedError) as info:
        await collect(stream)
    assert info.value.partial_text


async def test_stream_without_done_still_completes_with_usage(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    sim.set_default("a", Fault.no_done())
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    assert (await collect(stream)).endswith(".")
    assert stream.usage is not None


def test_sync_stream(make_router: RouterFactory, sim):
    router = make_router({"primary": ["a"]})
    sim.script("a", Fault.server_error(502))
    stream = router.completion(model="primary", messages=MSG, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("Hello from a.")
    assert sim.count("a") == 2
    assert stream.report.outcome == "success"


async def test_chunks_have_the_shapes_a_plain_router_gives(make_router: RouterFactory, sim):
    """The router asks for usage itself (report, cost guard) but the caller sees the usage-only
    last chunk (choices == []) only when it asked, so `chunk.choices[0]` loops never break."""
    router = make_router({"primary": ["a"]})
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    chunks = [c async for c in stream]
    assert chunks and all(c.choices for c in chunks)
    assert stream.usage and stream.usage["completion_tokens"] > 0  # still known to the plugin
    asked = await router.acompletion(
        model="primary", messages=LONG, stream=True, stream_options={"include_usage": True}
    )
    last = [c async for c in asked][-1]
    assert usage_only(last) and last.usage.total_tokens > 0
