"""Continuing a broken stream by assistant prefill, over loopback: one prefill of everything
shown on the caller's own messages, a restart from scratch that never carries a prefill, a
refused prefill that restarts elsewhere instead of surfacing, honest labels and counts."""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience_plugin import ResilientRouter, StreamInterruptedError, get_report
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.events import StreamRestart
from llm_resilience_plugin.testing import FakeClock, Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, _merge, deployment

LONG = [{"role": "user", "content": "tell me a long story about cats and dogs and birds"}]
PREFILL = {"continue_streams_with_prefill": True}


def make(
    sim: ProviderSimulator,
    made: list[ResilientRouter],
    groups: dict[str, dict[str, bool | None]],
    fallbacks: list[str],
    policy: dict[str, Any] | None = None,
    model: str = "openai/gpt-4o-mini",
) -> ResilientRouter:
    """Groups of deployments, each with its supports_assistant_prefill flag (None: model map);
    the first group falls back to the others in order."""
    model_list = []
    for group, deps in groups.items():
        for dep, flag in deps.items():
            d = deployment(sim, group, dep, model=model)
            if flag is not None:
                d["model_info"]["supports_assistant_prefill"] = flag
            model_list.append(d)
    first = next(iter(groups))
    router = ResilientRouter(
        model_list=model_list,
        fallbacks=[{first: fallbacks}] if fallbacks else None,
        policy=_merge(FAST_POLICY, policy or PREFILL),
        clock=FakeClock(),
        seed=1234,
    )
    made.append(router)
    return router


async def read(stream: Any) -> tuple[str, list[StreamRestart]]:
    """The text the caller ends up with (a "restart" marker discards what came before it)."""
    text, markers = "", []
    async for item in stream:
        if isinstance(item, StreamRestart):
            markers.append(item)
            text = "" if item.mode == "restart" else text
            continue
        for choice in item.choices:
            text += choice.delta.content or ""
    return text, markers


def prefills(sim: ProviderSimulator, dep: str) -> list[list[Any]]:
    """The assistant messages each request to ``dep`` carried."""
    return [[m for m in r.body["messages"] if m["role"] == "assistant"] for r in sim.requests(dep)]


# -- a refused prefill restarts from scratch ------------------------------------------------------


@pytest.mark.parametrize("status", [400, 422])
async def test_a_refused_prefill_restarts_from_scratch_on_the_next_fallback_group(
    sim, routers, status: int
) -> None:
    router = make(
        sim,
        routers,
        {"primary": {"a": None}, "backup": {"b": True}, "last": {"c": False}},
        ["backup", "last"],
    )
    sim.script("a", Fault.stream_cut(after_chunks=3))
    sim.set_default("b", Fault.http_error(status, "assistant prefill is not supported for this model"))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text, markers = await read(stream)
    assert text.startswith("Hello from c.")
    assert [(m.mode, m.discarded_text) for m in markers] == [("restart", "Hello from a. ")]
    assert prefills(sim, "b") == [[{"role": "assistant", "content": "Hello from a. ", "prefix": True}]]
    assert prefills(sim, "c") == [[]]  # from scratch: the caller's own messages
    report = get_report(stream)
    assert report is not None and report.outcome == "success" and report.error_class is None
    assert report.stream_restarts == 1 and report.served_group == "last"
    refusal = next(a for a in report.attempts if a.deployment_id == "b")
    assert refusal.error_class is ErrorClass.BAD_REQUEST and refusal.status == status
    # our request shape, not the provider's health: the breaker counted nothing against b
    assert router.breakers()["b"]["state"] == "closed" and router.breakers()["b"]["fail_counter"] == 0


async def test_a_refused_prefill_restarts_on_a_sibling_that_takes_no_prefill(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": None}, "backup": {"b1": True, "b2": False}}, ["backup"])
    sim.script("a", Fault.stream_cut(after_chunks=3))
    sim.script("b1", Fault.http_error(400, "prefill not supported"))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text, markers = await read(stream)
    assert text.startswith("Hello from b2.") and [m.mode for m in markers] == ["restart"]
    assert (sim.count("b1"), sim.count("b2")) == (1, 1) and prefills(sim, "b2") == [[]]


async def test_the_refuser_is_the_last_resort_and_never_offered_a_prefill_again(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": None}, "backup": {"b": True}}, ["backup"])
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    sim.script("b", Fault.http_error(400, "prefill not supported"))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text, markers = await read(stream)
    # nothing else left: the deployment that refused the prefill takes the request from scratch
    assert text.startswith("Hello from b.") and [m.mode for m in markers] == ["restart"]
    assert [len(p) for p in prefills(sim, "b")] == [1, 0]
    # the next broken stream goes straight to a restart: no second refusal to pay
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text, markers = await read(stream)
    assert text.startswith("Hello from b.") and [m.mode for m in markers] == ["restart"]
    assert [len(p) for p in prefills(sim, "b")] == [1, 0, 0]


async def test_when_the_restart_finds_no_route_the_original_failure_surfaces(sim, routers) -> None:
    router = make(
        sim,
        routers,
        {"primary": {"a": None}, "backup": {"b": True}, "last": {"c": False}},
        ["backup", "last"],
    )
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    sim.set_default("b", Fault.http_error(400, "assistant prefill is not supported here"))
    sim.set_default("c", Fault.http_error(503, "down"))
    seen: list[Any] = []
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, listener=seen.append)
    with pytest.raises(StreamInterruptedError) as info:
        await read(stream)
    assert "Connection error" in str(info.value.cause)  # the break, never the refusal
    assert info.value.partial_text == "Hello from a. "
    assert sim.count("b") == 2 and sim.count("c") >= 1  # the refuser was tried last, from scratch
    report = get_report(stream)
    assert report is not None and report.outcome == "failure" and report.stream_restarts == 0
    assert report.error_class is ErrorClass.CONNECTION
    ends = [e for e in seen if type(e).__name__ == "CallReport"]
    assert len(ends) == 1  # the call ends once: no report for the tries on the way


# -- a second break ---------------------------------------------------------------------------


async def _both_primaries_cut(
    sim: ProviderSimulator, routers: list[ResilientRouter], *, backup_prefills: bool
) -> tuple[Any, str, list[StreamRestart], str, str]:
    """Both primary deployments (prefill-capable) cut after 3 chunks, then the backup: the stream,
    its text and markers, the first deployment cut and all the text shown before the backup."""
    groups = {"primary": {"a1": True, "a2": True}, "backup": {"b": backup_prefills}}
    router = make(sim, routers, groups, ["backup"])
    sim.set_default("a1", Fault.stream_cut(after_chunks=3))
    sim.set_default("a2", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text, markers = await read(stream)
    first, _ = (r.deployment for r in sim.requests() if r.deployment != "b")
    # the second primary continues the first's text (three more words of its answer)
    shown = f"Hello from {first}. You said: tell "
    return stream, text, markers, first, shown


async def test_a_second_break_continues_with_one_prefill_of_everything_shown(sim, routers) -> None:
    stream, text, markers, first, shown = await _both_primaries_cut(sim, routers, backup_prefills=True)
    assert [(m.mode, m.discarded_text) for m in markers] == [
        ("continue", f"Hello from {first}. "),
        ("continue", shown),
    ]
    assert text.startswith(shown + "me a long story") and text.endswith(".")
    (sent,) = [r.body["messages"] for r in sim.requests("b")]
    assert sent == [*LONG, {"role": "assistant", "content": shown, "prefix": True}]
    assert stream.partial_text == text
    assert get_report(stream).stream_restarts == 2  # type: ignore[union-attr]


async def test_a_restart_after_a_continue_sends_the_callers_own_messages(sim, routers) -> None:
    stream, text, markers, first, shown = await _both_primaries_cut(sim, routers, backup_prefills=False)
    assert [(m.mode, m.discarded_text) for m in markers] == [
        ("continue", f"Hello from {first}. "),
        ("restart", shown),
    ]
    assert [r.body["messages"] for r in sim.requests("b")] == [LONG]  # no prefill to b
    assert text.startswith("Hello from b.") and stream.partial_text == text
    report = get_report(stream)
    assert report is not None and report.error_class is None and report.stream_restarts == 2


async def test_a_second_break_with_nowhere_left_keeps_all_the_shown_text(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": None}, "backup": {"b": True}}, ["backup"])
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    sim.set_default("b", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    with pytest.raises(StreamInterruptedError) as info:
        await read(stream)
    assert info.value.partial_text == "Hello from a. You said: tell "  # b continued a's text
    assert get_report(stream).stream_restarts == 1  # type: ignore[union-attr]


# -- labels, counts, the model map ------------------------------------------------------------


async def test_routes_without_prefill_are_passed_over_without_a_circuit_open_label(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": None}, "backup": {"b": False}}, ["backup"])
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text, markers = await read(stream)
    assert text.startswith("Hello from b.") and [m.mode for m in markers] == ["restart"]
    report = get_report(stream)
    assert report is not None and report.outcome == "success" and report.error_class is None
    assert [(a.deployment_id, a.outcome) for a in report.attempts] == [("a", "failure"), ("b", "success")]
    assert all(a.error_class is not ErrorClass.CIRCUIT_OPEN for a in report.attempts)


async def test_litellms_model_map_says_who_can_continue(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": None}}, [])
    ds = make(
        sim,
        routers,
        {"primary": {"a": None}, "backup": {"ds": None}},
        ["backup"],
        model="deepseek/deepseek-chat",
    )
    del router  # only ``ds`` (both deployments deepseek-chat, per LiteLLM's map: prefill) is used
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await ds.acompletion(model="primary", messages=LONG, stream=True)
    _, markers = await read(stream)
    assert [m.mode for m in markers] == ["continue"]
    assert prefills(sim, "ds") == [[{"role": "assistant", "content": "Hello from a. ", "prefix": True}]]


async def test_only_restarts_that_sent_a_request_are_counted(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": None}}, [], policy={"restart_broken_streams": True})
    sim.script("a", Fault.stream_cut(after_chunks=3))
    seen: list[Any] = []
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, listener=seen.append)
    with pytest.raises(StreamInterruptedError):
        await read(stream)
    assert get_report(stream).stream_restarts == 0 and sim.count() == 1  # type: ignore[union-attr]
    assert not [e for e in seen if isinstance(e, StreamRestart)]


async def test_every_route_cut_counts_one_restart_per_new_route(sim, routers) -> None:
    router = make(
        sim,
        routers,
        {"primary": {"a1": None, "a2": None, "a3": None}, "backup": {"b": None}},
        ["backup"],
        policy={"restart_broken_streams": True, "max_stream_restarts": 10},
    )
    for dep in ("a1", "a2", "a3", "b"):
        sim.set_default(dep, Fault.stream_cut(after_chunks=3))
    seen: list[Any] = []
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, listener=seen.append)
    with pytest.raises(StreamInterruptedError):
        await read(stream)
    restarts = [e for e in seen if isinstance(e, StreamRestart)]
    assert sim.count() == 4 and len(restarts) == 3
    assert get_report(stream).stream_restarts == 3  # type: ignore[union-attr]
