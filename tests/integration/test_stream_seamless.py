"""Seamless stream recovery, the default, over loopback: a stream broken after content goes on
with nothing in-band - continued by assistant prefill (another deployment of the group, the
fallback chain, the deployment that broke last), or replayed and checked word for word against
what the caller saw - else the typed error carrying a replacement answer. Each break's end is
in the report and published."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from llm_resilience_plugin import ResilientRouter, StreamInterruptedError, get_report
from llm_resilience_plugin.cost._guard import Budget, CostGuard
from llm_resilience_plugin.events import StreamBreak, StreamRestart
from llm_resilience_plugin.testing import Clock, FakeClock, Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, WEATHER_TOOLS, _merge, deployment

LONG = [{"role": "user", "content": "tell me a long story about cats and dogs and birds"}]
STORY = "Once upon a time a cat, a dog and a bird shared one garden and never once quarrelled."
OTHER = "Once there was a fox who lived alone in a quiet wood beyond the river and the hills."
SAME = {"temperature": 0}  # a request whose answer reproduces (a replay is worth trying)


def make(
    sim: ProviderSimulator,
    made: list[ResilientRouter],
    groups: dict[str, dict[str, bool]],
    policy: dict[str, Any] | None = None,
    **kwargs: Any,
) -> ResilientRouter:
    """Groups of deployments, each with its supports_assistant_prefill flag; the first group
    falls back to the others in order."""
    model_list = []
    for group, deps in groups.items():
        for dep, flag in deps.items():
            d = deployment(sim, group, dep)
            d["model_info"]["supports_assistant_prefill"] = flag
            model_list.append(d)
    first, *rest = groups
    router = ResilientRouter(
        model_list=model_list,
        fallbacks=[{first: rest}] if rest else None,
        policy=_merge(FAST_POLICY, policy or {}),
        clock=kwargs.pop("clock", None) or FakeClock(),
        seed=1234,
        **kwargs,
    )
    made.append(router)
    return router


def cut(after: int = 3, text: str | None = None) -> Any:
    return dataclasses.replace(Fault.stream_cut(after_chunks=after), text=text)


async def read(stream: Any) -> str:
    """What a plain chunk loop reads: ``chunk.choices[0].delta.content``, nothing else."""
    text = ""
    async for chunk in stream:
        assert not isinstance(chunk, StreamRestart)  # nothing in-band on the default path
        for choice in chunk.choices:
            text += choice.delta.content or ""
    return text


def breaks(stream: Any) -> list[tuple[str, str | None, str | None]]:
    report = get_report(stream)
    assert report is not None
    return [(b.end, b.broken_deployment, b.deployment_id) for b in report.stream_breaks]


def sent_prefills(sim: ProviderSimulator, dep: str) -> list[list[Any]]:
    return [[m for m in r.body["messages"] if m["role"] == "assistant"] for r in sim.requests(dep)]


# -- continue by prefill ------------------------------------------------------------------------


async def test_a_cut_continues_on_another_deployment_of_the_group_first(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a1": True, "a2": True}, "backup": {"b": True}})
    sim.set_default("a1", Fault.stream_cut(after_chunks=3))
    sim.set_default("a2", Fault.stream_cut(after_chunks=3))
    seen: list[Any] = []
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, listener=seen.append)
    text = await read(stream)
    first = sim.requests()[0].deployment
    sibling = "a2" if first == "a1" else "a1"
    # the sibling broke too: its continuation is continued again on the fallback, one answer
    assert text == f"Hello from {first}. You said: tell me a long story about cats and dogs and birds."
    assert breaks(stream) == [("continued", first, sibling), ("continued", sibling, "b")]
    assert sent_prefills(sim, sibling) == [
        [{"role": "assistant", "content": f"Hello from {first}. ", "prefix": True}]
    ]
    report = get_report(stream)
    assert report is not None and report.outcome == "success" and report.stream_restarts == 2
    published = [e for e in seen if isinstance(e, StreamBreak)]
    assert published == report.stream_breaks  # each break's end is an event too
    assert not [e for e in seen if isinstance(e, StreamRestart)]
    # the continuation that broke again reported no usage: its extra tokens are unknown, not 0
    assert report.stream_breaks[0].extra_tokens is None
    last = report.stream_breaks[1]  # the prompt and the prefill, sent again to b
    assert last.extra_tokens is not None and last.extra_tokens > report.usage["prompt_tokens"] // 2  # type: ignore[index]
    assert all(b.wait_s is not None and b.wait_s >= 0 for b in report.stream_breaks)


async def test_a_cut_continues_on_the_fallback_group(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}})
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text = await read(stream)
    assert text == "Hello from a. You said: tell me a long story about cats and dogs and birds."
    assert breaks(stream) == [("continued", "a", "b")]
    assert get_report(stream).served_group == "backup"  # type: ignore[union-attr]


async def test_the_deployment_that_broke_continues_last(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": True}, "backup": {"b": False}})
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text = await read(stream)
    assert text == "Hello from a. You said: tell me a long story about cats and dogs and birds."
    assert breaks(stream) == [("continued", "a", "a")]
    assert sim.count("b") == 0  # b takes no prefill: never sent one


@pytest.mark.parametrize(
    "fault",
    [Fault.stream_stall(after_chunks=3, seconds=5), Fault.malformed_chunk(after_chunks=3)],
    ids=["stall", "undecodable-event"],
)
async def test_a_stall_or_an_undecodable_event_continues_elsewhere(sim, routers, fault) -> None:
    router = make(
        sim, routers, {"primary": {"a": False}, "backup": {"b": True}}, policy={"stream_idle_timeout": 0.3}
    )
    sim.script("a", fault)
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    text = await read(stream)
    assert text.startswith("Hello from a. ") and text.endswith("cats and dogs and birds.")
    assert text.count("Hello from") == 1
    assert [b[0] for b in breaks(stream)] == ["continued"]


def test_sync_streams_continue_the_same_way(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}})
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = router.completion(model="primary", messages=LONG, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello from a. You said: tell me a long story about cats and dogs and birds."
    assert breaks(stream) == [("continued", "a", "b")]


# -- verified replay ------------------------------------------------------------------------------


async def test_a_refused_prefill_moves_on_silently_to_a_verified_replay(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}, "last": {"c": False}})
    sim.script("a", cut(4, STORY))
    sim.set_default("b", Fault.http_error(400, "assistant prefill is not supported"))
    sim.set_default("c", Fault.ok(text=STORY))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, **SAME)
    assert await read(stream) == STORY
    assert breaks(stream) == [("replayed", "a", "c")]
    report = get_report(stream)
    assert report is not None and report.outcome == "success" and report.error_class is None
    (brk,) = report.stream_breaks
    assert (
        brk.extra_tokens is not None and brk.extra_tokens > 0 and brk.shown_chars == len("Once upon a time ")
    )


async def test_a_replay_on_the_same_route_goes_on_after_what_was_shown(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}})
    sim.script("a", cut(4, STORY))
    sim.set_default("a", Fault.ok(text=STORY))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, **SAME)
    assert await read(stream) == STORY
    assert breaks(stream) == [("replayed", "a", "a")]
    assert [r.stream for r in sim.requests("a")] == [True, True]


async def test_a_replay_on_another_deployment_of_the_group(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a1": False, "a2": False}})
    sim.set_default("a1", cut(4, STORY))  # a1 always breaks; a2 gives the same answer
    sim.set_default("a2", Fault.ok(text=STORY))
    for _ in range(8):  # until the shuffle picks a1 first
        sim.clear_log()
        stream = await router.acompletion(model="primary", messages=LONG, stream=True, seed=7)
        assert await read(stream) == STORY
        if sim.requests()[0].deployment == "a1":
            break
    assert breaks(stream) == [("replayed", "a1", "a2")]
    assert [r.deployment for r in sim.requests()] == ["a1", "a2"]


async def test_a_diverging_replay_is_discarded_and_the_call_moves_on(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}})
    sim.script("a", cut(4, STORY))
    sim.set_default("a", Fault.ok(text=STORY))  # the broken deployment, tried last, reproduces
    sim.set_default("b", Fault.ok(text=OTHER))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, **SAME)
    assert await read(stream) == STORY
    assert breaks(stream) == [("diverged", "a", "b"), ("replayed", "a", "a")]
    assert breaker_counts(router)["b"] == 0  # a diverging answer is no failure


async def test_when_every_replay_diverges_the_error_carries_a_replacement(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}})
    sim.script("a", cut(4, STORY))
    sim.set_default("a", Fault.ok(text=OTHER))
    sim.set_default("b", Fault.ok(text=OTHER))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, **SAME)
    with pytest.raises(StreamInterruptedError) as info:
        await read(stream)
    err = info.value
    assert err.partial_text == "Once upon a time "
    assert err.replacement is not None and err.replacement.choices[0].message.content == OTHER
    assert [b[0] for b in breaks(stream)] == ["diverged", "diverged", "given_up"]
    report = get_report(stream)
    assert report is not None and report.outcome == "failure" and report.stream_restarts == 3
    assert report.total_latency_s < FAST_POLICY["deadline"]


async def test_a_sampling_request_is_not_replayed(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": False}})
    sim.script("a", cut(4, STORY))
    sim.set_default("b", Fault.ok(text=STORY))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, temperature=0.7)
    with pytest.raises(StreamInterruptedError) as info:
        await read(stream)
    assert info.value.replacement.choices[0].message.content == STORY
    assert [r.stream for r in sim.requests("b")] == [False]  # asked whole, never streamed again
    assert breaks(stream) == [("given_up", "a", "b")]


async def test_the_replay_rule_can_be_forced(sim, routers) -> None:
    router = make(
        sim, routers, {"primary": {"a": False}, "backup": {"b": False}}, {"replay_broken_streams": "always"}
    )
    sim.script("a", cut(4, STORY))
    sim.set_default("b", Fault.ok(text=STORY))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    assert await read(stream) == STORY


async def test_the_restart_cap_bounds_seamless_recovery(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": True}, "backup": {"b": True}}, {"max_stream_restarts": 1})
    sim.set_default("a", Fault.stream_cut(after_chunks=3))
    sim.set_default("b", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True)
    with pytest.raises(StreamInterruptedError) as info:
        await read(stream)
    assert info.value.partial_text == "Hello from a. You said: tell "
    assert [b[0] for b in breaks(stream)] == ["continued", "given_up"]
    assert sim.count() == 2


async def test_each_recovery_attempt_reserves_and_settles_with_the_cost_guard(sim, routers) -> None:
    guard = CostGuard([Budget.daily(1.0)])
    router = make(sim, routers, {"primary": {"a": False}, "backup": {"b": True}}, guards=[guard])
    sim.script("a", Fault.stream_cut(after_chunks=3))
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, max_tokens=50)
    await read(stream)
    broken, continued = guard.ledger.entries()  # the broken stream's content was billed too
    assert broken.estimated and not continued.estimated
    (usage,) = [u for u in guard.report().budgets if u.budget == "daily"]
    assert usage.reserved == 0 and usage.spent == pytest.approx(broken.cost + continued.cost)


async def test_a_recovery_never_outlives_the_deadline(sim, routers) -> None:
    router = make(
        sim, routers, {"primary": {"a": False}, "backup": {"b": True}}, {"deadline": 0.8}, clock=Clock()
    )
    sim.script("a", Fault.stream_stall(after_chunks=3, seconds=5))
    sim.set_default("b", Fault.ok(chunk_delay=0.2))  # continues, too slowly to finish in time
    stream = await router.acompletion(model="primary", messages=LONG, stream=True, stream_idle_timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(StreamInterruptedError):
        await read(stream)
    assert time.monotonic() - t0 < 1.5


# -- tool calls ----------------------------------------------------------------------------------


async def test_a_broken_tool_call_is_never_joined_with_another_answer(sim, routers) -> None:
    router = make(sim, routers, {"primary": {"a": True}, "backup": {"b": True}})
    sim.script("a", Fault.stream_cut(after_chunks=2))
    ask = [{"role": "user", "content": "what is the weather in Paris"}]
    stream = await router.acompletion(model="primary", messages=ask, stream=True, tools=WEATHER_TOOLS, **SAME)
    args = ""
    with pytest.raises(StreamInterruptedError) as info:
        async for chunk in stream:
            for call in chunk.choices[0].delta.tool_calls or []:
                args += call.function.arguments or ""
    assert args  # part of the arguments reached the caller, then the stream broke
    whole = info.value.replacement.choices[0].message.tool_calls[0].function.arguments
    assert whole.startswith("{") and whole.endswith("}") and whole != args
    assert [m for r in sim.requests("b") for m in r.body["messages"] if m["role"] == "assistant"] == []
    assert [r.stream for r in sim.requests("b")] == [False]


# -- text completion and Responses ---------------------------------------------------------------


def _ops_router(
    sim: ProviderSimulator, made: list[ResilientRouter], model: str, info: dict[str, Any]
) -> ResilientRouter:
    model_list = [
        {
            "model_name": "g",
            "litellm_params": {"model": model, "api_base": sim.api_base(d), "api_key": "sk-sim-secret"},
            "model_info": {"id": d, **info},
        }
        for d in ("a", "b")
    ]
    router = ResilientRouter(model_list=model_list, policy=FAST_POLICY, clock=FakeClock(), seed=3)
    made.append(router)
    return router


async def test_a_text_completion_stream_is_replayed_and_verified(sim, routers) -> None:
    router = _ops_router(sim, routers, "openai/gpt-3.5-turbo-instruct", {"mode": "completion"})
    for dep in ("a", "b"):
        sim.set_default(dep, Fault.ok(text=STORY))
        sim.script(dep, cut(4, STORY))
    stream = await router.atext_completion("g", "tell me a story", stream=True, **SAME)
    text = "".join([c.choices[0].text or "" async for c in stream if c.choices])
    assert text == STORY
    # each deployment breaks once: every break ends in a verified replay
    assert {b[0] for b in breaks(stream)} == {"replayed"}


async def test_a_responses_stream_is_replayed_and_verified(sim, routers) -> None:
    router = _ops_router(sim, routers, "openai/gpt-4o-mini", {"mode": "responses"})
    for dep in ("a", "b"):
        sim.set_default(dep, Fault.ok(text=STORY))
        sim.script(dep, cut(4, STORY))
    stream = await router.aresponses("g", "tell me a story", stream=True, **SAME)
    events = [e async for e in stream]
    deltas = [
        e.delta for e in events if str(getattr(e.type, "value", e.type)) == "response.output_text.delta"
    ]
    assert "".join(deltas) == STORY
    kinds = [str(getattr(e.type, "value", e.type)) for e in events]
    assert kinds.count("response.created") == 1  # the replay's opening events are not repeated
    assert {b[0] for b in breaks(stream)} == {"replayed"}


def breaker_counts(router: ResilientRouter) -> dict[str, int]:
    return {dep: state["fail_counter"] for dep, state in router.breakers().items()}
