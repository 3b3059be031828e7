"""One unparseable SSE event is skipped in place (direct dispatch, OpenAI-SDK streams): the answer
completes on the same deployment, whole, from one upstream request, and the report counts it. An
event that may carry text, one over the cap, or one on a Router-dispatched group is a break as
before (the answer resumes elsewhere)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from llm_resilience_plugin import StreamInterruptedError, get_report
from llm_resilience_plugin.events import StreamRestart
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.observability import JsonFormatter, attach_router_logging
from llm_resilience_plugin.testing import Fault
from tests.conftest import RouterFactory, requires_capability

# The equivalence suite of a LiteLLM internal: skipped, naming it, where this LiteLLM lacks it.
pytestmark = requires_capability("sse_skipping")

LONG = [{"role": "user", "content": "tell me a long story about cats and dogs and birds"}]
STORY = "Hello from a. You said: tell me a long story about cats and dogs and birds."
SECRET = "sk-sim-secret"  # the api_key of every conftest deployment
TWO = {"groups": {"primary": ["a"], "backup": ["b"]}, "fallbacks": [{"primary": ["backup"]}]}


def _router(make_router: RouterFactory, **kwargs: Any) -> Any:
    return make_router(TWO["groups"], fallbacks=TWO["fallbacks"], **kwargs)


async def read(stream: Any) -> tuple[str, list[StreamRestart]]:
    text, markers = "", []
    async for c in stream:
        if isinstance(c, StreamRestart):
            markers.append(c)
            if c.mode == "restart":
                text = ""
        elif c.choices:
            text += c.choices[0].delta.content or ""
    return text, markers


@pytest.mark.parametrize("recover", [False, True], ids=["switch-off", "switch-on"])
async def test_one_text_free_malformed_event_is_skipped_on_the_same_deployment(
    make_router: RouterFactory, sim, recover: bool
) -> None:
    router = _router(make_router)
    sim.script("a", Fault.malformed_chunk(after_chunks=3, content=False))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=recover)
    text, markers = await read(stream)
    assert text == STORY and markers == []
    rep = get_report(stream)
    assert rep is not None and rep.outcome == "success" and rep.deployment_id == "a"
    assert rep.skipped_stream_events == 1 and rep.stream_restarts == 0 and rep.upstream_requests == 1
    assert rep.to_dict()["skipped_stream_events"] == 1
    assert SECRET not in json.dumps(rep.to_dict(), default=str)
    assert sim.count("a") == 1 and sim.count("b") == 0
    assert router.breakers()["a"]["fail_counter"] == 0


def test_sync_stream_skips_too(make_router: RouterFactory, sim) -> None:
    router = _router(make_router)
    sim.script("a", Fault.malformed_chunk(after_chunks=0, content=False))  # before the first content
    stream = router.completion(model="primary", messages=LONG, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    rep = get_report(stream)
    assert text == STORY and rep is not None and rep.skipped_stream_events == 1
    assert sim.count("a") == 1 and sim.count("b") == 0


async def test_an_event_that_may_carry_text_is_not_skipped(make_router: RouterFactory, sim) -> None:
    router = _router(make_router)
    sim.script("a", Fault.malformed_chunk(after_chunks=3))  # its JSON shows "content": "oops"
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=True)
    text, markers = await read(stream)
    assert text.startswith("Hello from b") and len(markers) == 1
    rep = get_report(stream)
    assert rep is not None and rep.skipped_stream_events == 0 and rep.stream_restarts == 1
    assert rep.served_group == "backup" and sim.count("a") == 1 and sim.count("b") == 1
    # without the switch: the typed error with the partial text, as before (no key in it)
    sim.script("a", Fault.malformed_chunk(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    with pytest.raises(StreamInterruptedError) as info:
        await read(stream)
    assert info.value.partial_text.startswith("Hello") and SECRET not in str(info.value)
    assert info.value.report is not None and info.value.report.skipped_stream_events == 0


async def test_two_malformed_events_are_over_the_cap_and_resume_elsewhere(
    make_router: RouterFactory, sim
) -> None:
    router = _router(make_router)
    sim.script("a", Fault.malformed_chunk(after_chunks=3, content=False, repeat=2))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=True)
    text, markers = await read(stream)
    assert text.startswith("Hello from b") and len(markers) == 1
    rep = get_report(stream)
    assert rep is not None and rep.stream_restarts == 1 and rep.served_group == "backup"
    assert rep.skipped_stream_events == 1  # the first was dropped, the second broke the stream
    assert sim.count("a") == 1 and sim.count("b") == 1


async def test_a_router_dispatched_group_does_not_skip(make_router: RouterFactory, sim) -> None:
    router = _router(make_router, policy={"dispatch": "router"})
    sim.script("a", Fault.malformed_chunk(after_chunks=3, content=False))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, recover_streams=True)
    text, _ = await read(stream)
    rep = get_report(stream)
    assert text.startswith("Hello from b") and rep is not None and rep.skipped_stream_events == 0
    assert rep.stream_restarts == 1


async def test_json_log_counts_the_skip_without_secrets(
    make_router: RouterFactory, sim, caplog: pytest.LogCaptureFixture
) -> None:
    router = _router(make_router)
    detach = attach_router_logging(router, "test_sse_skip")
    sim.script("a", Fault.malformed_chunk(after_chunks=3, content=False))
    with caplog.at_level(logging.INFO, logger="test_sse_skip"):
        stream = await router.acompletion(model="primary", messages=LONG, stream=True)
        await read(stream)
    detach()
    lines = [JsonFormatter().format(r) for r in caplog.records]
    calls = [json.loads(line) for line in lines if '"skipped_stream_events"' in line]
    assert calls and calls[-1]["skipped_stream_events"] == 1
    assert all(SECRET not in line for line in lines)


async def test_chat_model_ainvoke_and_astream_skip_on_the_same_deployment(
    make_router: RouterFactory, sim
) -> None:
    router = _router(make_router)
    ask = [HumanMessage(LONG[0]["content"])]
    seen: list[Any] = []
    router.subscribe(seen.append)
    for how in ("ainvoke", "astream"):
        sim.reset()
        llm = ResilientChatModel(router=router, model="primary", streaming=True)
        sim.script("a", Fault.malformed_chunk(after_chunks=3, content=False))
        if how == "ainvoke":
            text = str((await llm.ainvoke(ask)).content)
        else:
            text = "".join([str(c.content) async for c in llm.astream(ask)])
        assert text == STORY
        assert sim.count("a") == 1 and sim.count("b") == 0
        reports = [e for e in seen if type(e).__name__ == "CallReport"]
        assert reports[-1].skipped_stream_events == 1 and reports[-1].upstream_requests == 1


async def test_an_azure_deployment_skips_too(sim) -> None:
    from llm_resilience_plugin import ResilientRouter
    from tests.conftest import FAST_POLICY

    def azure(dep: str) -> dict[str, Any]:
        return {
            "model_name": "primary",
            "litellm_params": {
                "model": "azure/gpt-4o-mini",
                "api_base": f"{sim.base_url}/{dep}",
                "api_key": SECRET,
                "api_version": "2024-10-21",
            },
            "model_info": {"id": dep},
        }

    router = ResilientRouter(model_list=[azure("a")], policy=FAST_POLICY)
    try:
        sim.script("a", Fault.malformed_chunk(after_chunks=3, content=False))
        stream = await router.acompletion(model="primary", messages=LONG, stream=True)
        text, _ = await read(stream)
        rep = get_report(stream)
        assert text == STORY and rep is not None and rep.skipped_stream_events == 1
        assert sim.count("a") == 1
    finally:
        router.close()
