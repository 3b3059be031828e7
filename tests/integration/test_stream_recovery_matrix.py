"""Seamless stream recovery, cell by cell: each way (continue by prefill, verified replay, the
typed error with its replacement) on each route (the deployment that broke, another deployment
of its group, the fallback group), for each operation that streams (chat, text completion,
Responses, a tool-call stream), sync and async, and LangChain ``astream`` - over loopback
against the simulator. Each test asserts the text the consumer read is one correct answer and
that the report's ``stream_breaks`` record the way and the route. Continuing applies to chat
only (text completion and Responses have no assistant prefill; a tool call is never continued
or replayed, only had again whole)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import litellm
import pytest
from langchain_core.messages import HumanMessage

from llm_resilience_plugin import ResilientRouter, StreamInterruptedError, get_report
from llm_resilience_plugin.events import StreamRestart
from llm_resilience_plugin.langchain import ResilientChatModel
from llm_resilience_plugin.testing import FakeClock, Fault, ProviderSimulator
from tests.conftest import FAST_POLICY, WEATHER_TOOLS, _merge

PROMPT = "tell me a long story about cats and dogs and birds"
STORY = "Once upon a time a cat, a dog and a bird shared one garden and never once quarrelled."
OTHER = "Once there was a fox who lived alone in a quiet wood beyond the river and the hills."
SAME = {"temperature": 0}  # an answer that reproduces: a replay is worth trying

# the operation -> (LiteLLM model, model_info mode)
MODELS = {
    "chat": ("openai/gpt-4o-mini", None),
    "tool": ("openai/gpt-4o-mini", None),
    "text": ("openai/gpt-3.5-turbo-instruct", "completion"),
    "responses": ("openai/gpt-4o-mini", "responses"),
}

# route -> the groups (deployment -> takes a prefill); the first group falls back to the rest.
# "other" has a1 always breaking and a2 answering; the call is repeated until a1 is picked first.
ROUTES = ["same", "other", "fallback"]
TRIES = 24  # the pick is about even: 24 routers all passing a1 over is a 1 in 16 million chance


def groups_for(route: str, prefill: bool) -> dict[str, dict[str, bool]]:
    if route == "same":  # nowhere else takes a prefill / no other route at all
        return {"primary": {"a": prefill}, "backup": {"b": False}} if prefill else {"primary": {"a": False}}
    if route == "other":
        return {"primary": {"a1": prefill, "a2": prefill}}
    return {"primary": {"a": False}, "backup": {"b": prefill}}


def broken_and_next(route: str) -> tuple[str, str]:
    return {"same": ("a", "a"), "other": ("a1", "a2"), "fallback": ("a", "b")}[route]


def build(
    sim: ProviderSimulator,
    made: list[ResilientRouter],
    op: str,
    groups: dict[str, dict[str, bool]],
    policy: dict[str, Any] | None = None,
    seed: int = 1234,
) -> ResilientRouter:
    model, mode = MODELS[op]
    model_list = []
    for group, deps in groups.items():
        for dep, flag in deps.items():
            info: dict[str, Any] = {"id": dep, "supports_assistant_prefill": flag}
            if mode:
                info["mode"] = mode
            model_list.append(
                {
                    "model_name": group,
                    "litellm_params": {
                        "model": model,
                        "api_base": sim.api_base(dep),
                        "api_key": "sk-sim-secret",
                    },
                    "model_info": info,
                }
            )
    first, *rest = groups
    router = ResilientRouter(
        model_list=model_list,
        fallbacks=[{first: rest}] if rest else None,
        policy=_merge(FAST_POLICY, policy or {}),
        clock=FakeClock(),
        seed=seed,
    )
    made.append(router)
    return router


def _kind(event: Any) -> str:
    return str(getattr(event.type, "value", event.type))


def _piece(op: str, item: Any) -> str:
    """What a plain consumer of each operation reads from one chunk or event."""
    assert not isinstance(item, StreamRestart)  # nothing in-band on the default path
    if op == "responses":
        return item.delta if _kind(item) == "response.output_text.delta" else ""
    if not item.choices:
        return ""
    if op == "text":
        return item.choices[0].text or ""
    if op == "tool":
        return "".join(c.function.arguments or "" for c in item.choices[0].delta.tool_calls or [])
    return item.choices[0].delta.content or ""


class Read:
    """One streamed call of ``op`` read to its end: the text, the stream (for its report), the
    Responses event kinds, and the typed error if one ended it."""

    def __init__(self) -> None:
        self.text = ""
        self.kinds: list[str] = []
        self.stream: Any = None
        self.error: StreamInterruptedError | None = None

    def take(self, op: str, item: Any) -> None:
        self.text += _piece(op, item)
        if op == "responses":
            self.kinds.append(_kind(item))


def _args(op: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if op == "text":
        return "atext_completion", {"prompt": PROMPT, **kwargs}
    if op == "responses":
        return "aresponses", {"input": PROMPT, **kwargs}
    if op == "tool":
        ask = [{"role": "user", "content": "what is the weather in Paris"}]
        return "acompletion", {"messages": ask, "tools": WEATHER_TOOLS, **kwargs}
    return "acompletion", {"messages": [{"role": "user", "content": PROMPT}], **kwargs}


def _counted(op: str) -> dict[str, Any]:
    """What a replay of ``op`` sends again, as LiteLLM's token counter takes it."""
    if op == "chat":
        return {"messages": [{"role": "user", "content": PROMPT}]}
    return {"text": PROMPT}


def _sync_read(router: ResilientRouter, op: str, kwargs: dict[str, Any]) -> Read:
    name, args = _args(op, kwargs)
    out = Read()
    out.stream = getattr(router, name[1:])(model="primary", stream=True, **args)
    try:
        for item in out.stream:
            out.take(op, item)
    except StreamInterruptedError as err:
        out.error = err
    return out


async def _async_read(router: ResilientRouter, op: str, kwargs: dict[str, Any]) -> Read:
    name, args = _args(op, kwargs)
    out = Read()
    out.stream = await getattr(router, name)(model="primary", stream=True, **args)
    try:
        async for item in out.stream:
            out.take(op, item)
    except StreamInterruptedError as err:
        out.error = err
    return out


async def call(
    sim: ProviderSimulator,
    factory: Callable[..., ResilientRouter],
    op: str,
    sync: bool,
    route: str,
    **kwargs: Any,
) -> Read:
    """One call on a new router; on the "other" route, repeated (up to TRIES routers, each with
    its own seed) until the shuffle sends it to the deployment that breaks first."""
    for i in range(TRIES):
        router = factory(seed=1234 + i)
        sim.clear_log()
        out = (
            await asyncio.to_thread(_sync_read, router, op, kwargs)
            if sync
            else await _async_read(router, op, kwargs)
        )
        if route != "other" or sim.requests()[0].deployment == "a1":
            return out
    raise AssertionError("a1 was never picked first")


def breaks(out: Read) -> list[tuple[str, str | None, str | None]]:
    report = get_report(out.stream)
    assert report is not None
    return [(b.end, b.broken_deployment, b.deployment_id) for b in report.stream_breaks]


def answer(dep: str) -> str:
    return f"Hello from {dep}. You said: {PROMPT}."


def cut(after: int, text: str | None = None) -> Any:
    return dataclasses.replace(Fault.stream_cut(after_chunks=after), text=text)


def script_break(sim: ProviderSimulator, route: str, fault: Any) -> None:
    """The first deployment breaks once (a1, on the "other" route, every time)."""
    if route == "other":
        sim.set_default("a1", fault)
    else:
        sim.script("a", fault)


SYNC = pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
ROUTE = pytest.mark.parametrize("route", ROUTES)


# -- continue by prefill: chat only ----------------------------------------------------------------


@SYNC
@ROUTE
async def test_continue(sim, routers, route: str, sync: bool) -> None:
    factory = functools.partial(build, sim, routers, "chat", groups_for(route, prefill=True))
    broke, went_on = broken_and_next(route)
    script_break(sim, route, Fault.stream_cut(after_chunks=3))
    out = await call(sim, factory, "chat", sync, route)
    assert out.error is None
    assert out.text == answer(broke)  # the broken deployment's answer, continued: one answer
    assert breaks(out) == [("continued", broke, went_on)]
    prefills = [m for r in sim.requests(went_on) for m in r.body["messages"] if m["role"] == "assistant"]
    assert prefills == [{"role": "assistant", "content": f"Hello from {broke}. ", "prefix": True}]


# -- verified replay: chat, text completion, Responses -----------------------------------------------


@SYNC
@ROUTE
@pytest.mark.parametrize("op", ["chat", "text", "responses"])
async def test_replay(sim, routers, op: str, route: str, sync: bool) -> None:
    factory = functools.partial(build, sim, routers, op, groups_for(route, prefill=False))
    broke, went_on = broken_and_next(route)
    script_break(sim, route, cut(4, STORY))
    sim.set_default(went_on, Fault.ok(text=STORY))  # after the scripted break, on "same"
    out = await call(sim, factory, op, sync, route, **SAME)
    assert out.error is None
    assert out.text == STORY
    assert breaks(out) == [("replayed", broke, went_on)]
    assert [r.stream for r in sim.requests(went_on)][-1] is True  # streamed again, not asked whole
    if op == "responses":
        assert out.kinds.count("response.created") == 1  # the replay's opening is not repeated
        assert out.kinds.count("response.completed") == 1


@SYNC
@pytest.mark.parametrize("op", ["chat", "text", "responses"])
async def test_a_diverging_replay_is_discarded(sim, routers, op: str, sync: bool) -> None:
    factory = functools.partial(build, sim, routers, op, {"primary": {"a": False}, "backup": {"b": False}})
    sim.script("a", cut(4, STORY))
    sim.set_default("a", Fault.ok(text=STORY))  # the broken deployment, tried last, reproduces
    sim.set_default("b", Fault.ok(text=OTHER))
    out = await call(sim, factory, op, sync, "fallback", **SAME)
    assert out.error is None and out.text == STORY
    assert breaks(out) == [("diverged", "a", "b"), ("replayed", "a", "a")]
    # b's replay was closed early, without usage: its tokens estimated (the prompt sent again and
    # the words read before it parted, counted), its cost not made up
    diverged = get_report(out.stream).stream_breaks[0]  # type: ignore[union-attr]
    sent = litellm.token_counter(model=MODELS[op][0], **_counted(op))
    assert diverged.extra_tokens is not None and sent < diverged.extra_tokens <= sent + 4
    assert diverged.extra_cost is None


# -- the typed error carrying the replacement: every operation ----------------------------------------


def replacement_text(op: str, replacement: Any) -> str:
    if op == "text":
        return replacement.choices[0].text
    if op == "responses":
        return "".join(
            part.text for item in replacement.output for part in getattr(item, "content", None) or []
        )
    if op == "tool":
        return replacement.choices[0].message.tool_calls[0].function.arguments
    return replacement.choices[0].message.content


@SYNC
@ROUTE
@pytest.mark.parametrize("op", ["chat", "text", "responses", "tool"])
async def test_typed_error_with_the_replacement(sim, routers, op: str, route: str, sync: bool) -> None:
    # a sampling request (no temperature 0, no seed) is not replayed, and no route takes a
    # prefill (a tool call is never continued): the answer is had again whole
    factory = functools.partial(build, sim, routers, op, groups_for(route, prefill=False))
    broke, went_on = broken_and_next(route)
    script_break(sim, route, Fault.stream_cut(after_chunks=2 if op == "tool" else 3))
    if op == "tool":  # a tool call is never replayed, even where its answer reproduces
        out = await call(sim, factory, op, sync, route, **SAME)
    else:
        out = await call(sim, factory, op, sync, route)
    assert out.error is not None, out.text
    err = out.error
    assert out.text  # part of the answer (of the arguments, for a tool call) was read
    # partial_text holds the text content the consumer saw: none in a tool call's deltas
    assert err.partial_text == ("" if op == "tool" else out.text)
    whole = replacement_text(op, err.replacement)
    if op == "tool":
        assert whole.startswith("{") and whole.endswith("}") and whole != out.text
    else:
        assert whole == answer(went_on)
    assert [r.stream for r in sim.requests(went_on)][-1] is False  # asked whole
    assert breaks(out) == [("given_up", broke, went_on)]
    assert err.report is not None and err.report.outcome == "failure"


# -- a stall past the idle limit and an undecodable event: the same ways, every operation ------------

BREAKS = {
    "stall": lambda n, text: dataclasses.replace(Fault.stream_stall(after_chunks=n, seconds=5), text=text),
    "undecodable-event": lambda n, text: dataclasses.replace(
        Fault.malformed_chunk(after_chunks=n), text=text
    ),
    # the undecodable event takes a content event's place: its text is lost with it
    "lost-event": lambda n, text: dataclasses.replace(
        Fault.malformed_chunk(after_chunks=n, replace=True), text=text
    ),
}


@SYNC
@pytest.mark.parametrize("kind", list(BREAKS))
@pytest.mark.parametrize("op", ["chat", "text", "responses", "tool"])
async def test_a_stall_or_an_undecodable_event(sim, routers, op: str, kind: str, sync: bool) -> None:
    # replayed on the fallback group and verified; a tool call is had again whole, in the error
    groups = {"primary": {"a": False}, "backup": {"b": False}}
    factory = functools.partial(build, sim, routers, op, groups, {"stream_idle_timeout": 0.3})
    sim.script("a", BREAKS[kind](2, None) if op == "tool" else BREAKS[kind](4, STORY))
    sim.set_default("b", Fault.ok(text=None if op == "tool" else STORY))
    out = await call(sim, factory, op, sync, "fallback", **SAME)
    if op == "tool":
        assert out.error is not None and out.text
        whole = replacement_text(op, out.error.replacement)
        assert whole.startswith("{") and whole.endswith("}") and whole != out.text
        assert breaks(out) == [("given_up", "a", "b")]
    elif op == "responses" and kind == "lost-event":
        # LiteLLM skips the event it cannot decode and the text shown has a hole; the part's
        # output_text.done states the whole text, so the plugin knows: not a success with a hole,
        # the typed error with the whole answer (a replay cannot match a text with a hole in it)
        assert out.error is not None and out.text != STORY
        assert "lost text" in str(out.error)
        # both routes' replays diverge from a text with a hole; the whole answer comes from one
        assert replacement_text(op, out.error.replacement) in (STORY, answer("a"))
        assert breaks(out)[0] == ("diverged", "a", "b") and breaks(out)[-1][0] == "given_up"
    elif op == "responses" and kind == "undecodable-event":
        # LiteLLM's Responses stream iterator drops an event it cannot decode before the plugin
        # sees it: the simulator's extra invalid event costs nothing here, and no break happens
        assert out.error is None and out.text == STORY
        assert breaks(out) == [] and sim.count("b") == 0
    else:
        # (a Responses part whose deltas fall short of the text its output_text.done states is a
        # break too: LiteLLM skipped the event that carried the rest)
        assert out.error is None and out.text == STORY
        assert breaks(out) == [("replayed", "a", "b")]


# -- LangChain astream ---------------------------------------------------------------------------------


ASK = [HumanMessage(PROMPT)]


async def _astream(
    sim: ProviderSimulator, factory: Callable[..., ResilientRouter], route: str, **model: Any
) -> tuple[str, StreamInterruptedError | None, list[tuple[str, str | None, str | None]]]:
    """``astream`` read to its end, on a new router each try (see :func:`call`)."""
    for i in range(TRIES):
        seen: list[Any] = []
        router = factory(seed=1234 + i)
        router.subscribe(seen.append)
        llm = ResilientChatModel(router=router, model="primary", **model)
        sim.clear_log()
        text, error = "", None
        try:
            async for chunk in llm.astream(ASK):
                text += str(chunk.content)
        except StreamInterruptedError as err:
            error = err
        if route == "other" and sim.requests()[0].deployment != "a1":
            continue
        (report,) = [e for e in seen if type(e).__name__ == "CallReport"]
        return text, error, [(b.end, b.broken_deployment, b.deployment_id) for b in report.stream_breaks]
    raise AssertionError("a1 was never picked first")


@ROUTE
async def test_langchain_astream_continues(sim, routers, route: str) -> None:
    factory = functools.partial(build, sim, routers, "chat", groups_for(route, prefill=True))
    broke, went_on = broken_and_next(route)
    script_break(sim, route, Fault.stream_cut(after_chunks=3))
    text, error, ends = await _astream(sim, factory, route)
    assert error is None and text == answer(broke)
    assert ends == [("continued", broke, went_on)]


@ROUTE
async def test_langchain_astream_replays(sim, routers, route: str) -> None:
    factory = functools.partial(build, sim, routers, "chat", groups_for(route, prefill=False))
    broke, went_on = broken_and_next(route)
    script_break(sim, route, cut(4, STORY))
    sim.set_default(went_on, Fault.ok(text=STORY))
    text, error, ends = await _astream(sim, factory, route, temperature=0)
    assert error is None and text == STORY
    assert ends == [("replayed", broke, went_on)]


@ROUTE
async def test_langchain_astream_raises_with_the_replacement(sim, routers, route: str) -> None:
    factory = functools.partial(build, sim, routers, "chat", groups_for(route, prefill=False))
    broke, went_on = broken_and_next(route)
    script_break(sim, route, Fault.stream_cut(after_chunks=3))
    text, error, ends = await _astream(sim, factory, route)
    assert error is not None and error.partial_text == text == f"Hello from {broke}. "
    assert error.replacement.choices[0].message.content == answer(went_on)
    assert ends == [("given_up", broke, went_on)]
