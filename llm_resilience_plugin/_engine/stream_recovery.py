"""How a call goes on after its stream broke with content already shown: the decisions (may it
recover, continue by prefill or start over, answer whole) and the walks that do it, all on the
call's own state - one deadline, one report, the deployments it ruled out.

The default, ``seamless`` (no marker; the caller's concatenated text is one answer):

1. **continue**: an assistant prefill holding all the text shown, on a deployment that takes one
   (elsewhere first: the group, then the fallback chain; the deployments that broke last);
2. **verified replay**, when one can reproduce the text (:func:`replay_model`): the request
   again from scratch on a deployment of the same model; the stream holds its text back until
   it covers what was shown, goes on after it when identical, else discards it and moves on;
3. else a **replacement**: the request again without streaming, handed to the caller inside the
   :class:`StreamInterruptedError` it gets (nothing in-band can take back what was shown).

The marker protocol (``recover_streams="restart"``/True, or the policy's switches):

* ``continue``: an assistant prefill holding all the text shown, where the route supports it
  (``continue_streams_with_prefill``); the answer goes on where it stopped.
* ``restart``: the caller's own request again, streamed, on a remaining route.
* ``answer`` (``recover_streams="answer"``, for callers that aggregate the stream, such as the
  chat model's ``invoke``): the request again without streaming; the whole answer is handed
  over in the :class:`StreamRestart` marker.

A prefill refused with a bad request is never surfaced (see :mod:`._engine.prefill`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from llm_resilience_plugin._engine import prefill as prefill_state
from llm_resilience_plugin._engine.core import router_resumes, stream_recovery_mode
from llm_resilience_plugin._engine.degradation import count_text_tokens, count_tokens
from llm_resilience_plugin._engine.drivers import walk_routes
from llm_resilience_plugin.errors import Failure
from llm_resilience_plugin.events import Outcome, StreamBreak, StreamRestart

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.attempt import AttemptContext
    from llm_resilience_plugin._engine.core import CallState
    from llm_resilience_plugin._engine.engine import Engine

ANSWER: Literal["answer"] = "answer"
"""``recover_streams`` value: recover a broken stream by asking again without streaming."""


Way = Literal["continue", "replay", "replacement"]


@dataclass(frozen=True, slots=True)
class Recovered:
    """How the call goes on: the marker the caller sees, and the new stream (``continue``,
    ``restart``) or the whole answer (``answer``, also in ``marker.response``). Seamless
    recovery has no marker; ``way`` says what ``result`` is: a stream that continues the text,
    a replay to verify, or the replacement answer for the caller's error."""

    marker: StreamRestart | None
    result: Any
    way: Way | None = None


def seamless(engine: Engine, call: CallState) -> bool:
    """Is ``call``'s stream recovered the seamless way (no marker)?"""
    return stream_recovery_mode(call.opts, engine.policies[call.report.requested_group]) == "seamless"


def may_recover(engine: Engine, call: CallState) -> bool:
    """Is a break after content recovered for this call: recovery on (the call's
    ``recover_streams``, else the policy's switches) and the policy's restart cap not reached?"""
    return router_resumes(call, engine.policies[call.report.requested_group])


def may_prefill(
    engine: Engine,
    call: CallState,
    kwargs: Mapping[str, Any],
    shown: str,
    saw_tools: bool,
    *,
    seamless: bool = False,
) -> bool:
    """May the answer be continued by an assistant prefill of ``shown``? Only for chat, with text
    shown, no tool call begun, and no format or forced tool the continuation could break; the
    marker protocol only where the policy's ``continue_streams_with_prefill`` says so."""
    constrained = "response_format" in kwargs or kwargs.get("tool_choice") not in (None, "auto", "none")
    return (
        (seamless or engine.policies[call.report.requested_group].continue_streams_with_prefill)
        and call.operation == "completion"  # assistant prefill is a chat message
        and bool(shown)
        and not saw_tools
        and not constrained
    )


def _out_of_time(engine: Engine, call: CallState) -> bool:
    return call.deadline.remaining() <= engine.policy.min_attempt_time


def give_up(engine: Engine, call: CallState, failure: Failure) -> None:
    """Publish the call's report as the original mid-stream failure: no recovery worked."""
    call.report.error_class = failure.error_class
    _publish_end(engine, call, "failure")


def record_break(engine: Engine, call: CallState, brk: StreamBreak) -> None:
    """Keep how a break ended in the call's report and publish it as an event."""
    call.report.stream_breaks.append(brk)
    engine.emit(call, brk)


def replay_model(
    engine: Engine, call: CallState, kwargs: Mapping[str, Any], broke: str | None, saw_tools: bool
) -> tuple[bool, str | None]:
    """Is a verified replay worth its tokens, and on which model only (None: any)? By the
    policy's ``replay_broken_streams``; ``"auto"``: a stream that showed no tool call, one
    choice (``n`` 1), reproducible sampling (``temperature`` 0 or a ``seed``), and only on
    deployments of the broken one's model (another model does not repeat its words)."""
    rule = engine.policies[call.report.requested_group].replay_broken_streams
    if rule == "never" or saw_tools:
        return False, None
    if rule == "always":
        return True, None
    if kwargs.get("n") not in (None, 1):
        return False, None
    if kwargs.get("temperature") != 0 and kwargs.get("seed") is None:
        return False, None
    info = engine.deployments.get(broke) if broke is not None else None
    return True, None if info is None else info.model


def replay_tokens(engine: Engine, deployment: str | None, sent: Any, received: str) -> int:
    """An estimate of the tokens a replay closed early cost, which the provider never reported:
    the prompt sent again (``sent``: chat messages, a prompt or a Responses input) plus the
    completion generated so far, counted from the text ``received``, with LiteLLM's offline
    counter for the deployment's model (about 4 characters a token where it has none)."""
    info = engine.deployments.get(deployment) if deployment is not None else None
    model = info.model if info is not None else "gpt-4o-mini"
    if isinstance(sent, list) and all(isinstance(m, Mapping) and "role" in m for m in sent):
        prompt = count_tokens(model, sent)
    else:
        prompt = count_text_tokens(model, sent if isinstance(sent, str) else json.dumps(sent, default=str))
    return prompt + count_text_tokens(model, received)


async def recover(
    engine: Engine,
    call: CallState,
    broken: AttemptContext,
    failure: Failure,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
    shown: str,
    *,
    saw_tools: bool,
) -> Recovered | None:
    """Go on after ``broken``'s stream failed with ``shown`` delivered: by prefill where allowed,
    else from scratch (streamed, or whole for ``recover_streams="answer"``). None: nowhere
    answered in time, and the report is published as ``failure``. A caller that leaves meanwhile
    gets it published as ``cancelled`` (:func:`cancelled`)."""
    if broken.picked is not None:
        call.avoid(broken.picked)  # go on somewhere else: this one just broke
    if _out_of_time(engine, call):
        give_up(engine, call, failure)
        return None
    refusers: frozenset[str] = frozenset()
    if may_prefill(engine, call, kwargs, shown, saw_tools):
        # One assistant prefill with everything shown so far, after the caller's messages.
        prefill = {"role": "assistant", "content": shown, "prefix": True}
        before = prefill_state.mark(call)
        call.require_prefill = True
        try:  # None: refused everywhere or nowhere to continue: start over instead
            nxt = await _continue_somewhere(engine, call, [*messages, prefill], kwargs, before)
        finally:
            call.require_prefill = False
        if nxt is not None:
            call.report.stream_restarts += 1
            marker = StreamRestart(call.call_id, broken.group, shown, failure.error_class, "continue")
            return Recovered(marker, nxt)
        refusers = prefill_state.settle_refusals(engine, call, before) - before.never_again
        if _out_of_time(engine, call):
            give_up(engine, call, failure)
            return None
    whole = call.opts.recover_streams == ANSWER
    result = await _from_scratch(
        engine, call, messages, _unstreamed(kwargs) if whole else kwargs, (refusers,), whole
    )
    if result is None:
        give_up(engine, call, failure)
        return None
    call.report.stream_restarts += 1
    if whole:  # the call ends here: the marker, then the report that counts it
        marker = StreamRestart(
            call.call_id, broken.group, shown, failure.error_class, ANSWER, response=result
        )
        engine.emit(call, marker)
        engine.emit(call, call.report)
        return Recovered(marker, result)
    return Recovered(StreamRestart(call.call_id, broken.group, shown, failure.error_class), result)


async def recover_seamless(
    engine: Engine,
    call: CallState,
    broken: AttemptContext,
    failure: Failure,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
    shown: str,
    *,
    saw_tools: bool,
    diverged: str | None = None,
) -> Recovered | None:
    """The seamless ladder after ``broken``'s stream failed with ``shown`` delivered (see the
    module docstring); ``diverged``: the deployment whose replay just differed (never used
    again). None: nothing answered in time; the break is recorded as given up and the report
    published as ``failure``, as it is when only a replacement answer was had."""
    if broken.picked is not None:
        call.stream_broke = call.stream_broke | {broken.picked}
    for dep in (broken.picked, diverged):
        if dep is not None:
            call.avoid(dep)  # go on somewhere else first
    last = call.stream_broke - call.opts.avoid - {diverged}
    pol = engine.policies[call.report.requested_group]

    def may_go_on() -> bool:  # time left, and the restart cap not reached
        return not _out_of_time(engine, call) and router_resumes(call, pol)

    refusers: frozenset[str] = frozenset()
    if may_go_on() and may_prefill(engine, call, kwargs, shown, saw_tools, seamless=True):
        nxt, refusers = await _prefill_walk(engine, call, messages, kwargs, shown, last)
        if nxt is not None:
            call.report.stream_restarts += 1
            return Recovered(None, nxt, "continue")
    # a deployment that refused the prefill, now or at an earlier break of this call, may still
    # answer from scratch (a replay must not go back to one whose replay differed)
    differed = {b.deployment_id for b in call.report.stream_breaks if b.end == "diverged"}
    refusers = (refusers | prefill_state.refused_in(engine, call)) - differed - {diverged}
    worth, model = replay_model(engine, call, kwargs, broken.picked, saw_tools)
    if worth and may_go_on():
        call.only_model = model
        try:
            nxt = await _from_scratch(
                engine, call, messages, kwargs, (refusers, last - refusers), whole=False
            )
        finally:
            call.only_model = None
        if nxt is not None:
            call.report.stream_restarts += 1
            return Recovered(None, nxt, "replay")
    answer = None
    if may_go_on():
        # a deployment whose replay differed is healthy: its own answer is a fine replacement
        healthy = refusers | frozenset(d for d in differed if d is not None)
        back = (healthy, last - healthy)
        answer = await _from_scratch(engine, call, messages, _unstreamed(kwargs), back, whole=True)
        if answer is not None:
            call.report.stream_restarts += 1
    gave_up(engine, call, failure, broken.picked, len(shown), answer)
    return None if answer is None else Recovered(None, answer, "replacement")


def gave_up(
    engine: Engine, call: CallState, failure: Failure, broke: str | None, shown: int, answer: Any
) -> None:
    """Seamless recovery found no way on: record the break as given up (naming the replacement
    answer's deployment, if one was had) and publish the report as the original failure."""
    brk = StreamBreak(
        call.call_id,
        call.report.requested_group,
        failure.error_class,
        "given_up",
        broke,
        call.served.deployment_id if answer is not None and call.served is not None else None,
        shown,
    )
    record_break(engine, call, brk)
    give_up(engine, call, failure)


async def _prefill_walk(
    engine: Engine,
    call: CallState,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
    shown: str,
    last: frozenset[str],
) -> tuple[Any, frozenset[str]]:
    """Continue ``shown`` by one assistant prefill on a deployment that takes one: elsewhere,
    then on ``last`` (the deployments that broke). (the stream or None, the refusers)."""
    prefill = {"role": "assistant", "content": shown, "prefix": True}
    before = prefill_state.mark(call)
    call.require_prefill = True
    nxt = None
    try:
        for attempt_last in (False, True):
            if attempt_last:
                back = last & call.never_again
                if not back or _out_of_time(engine, call):
                    break
                call.never_again = call.never_again - back
            nxt = await _continue_somewhere(engine, call, [*messages, prefill], kwargs, before)
            if nxt is not None:
                break
    finally:
        call.require_prefill = False
    refusers = prefill_state.settle_refusals(engine, call, before) - before.never_again
    for dep in last:
        call.avoid(dep)  # a replay goes elsewhere first again
    return nxt, refusers


async def _continue_somewhere(
    engine: Engine,
    call: CallState,
    prefilled: list[dict[str, Any]],
    kwargs: dict[str, Any],
    before: prefill_state.PrefillMark,
) -> Any:
    """Walk the routes with the prefilled messages; a deployment that refuses the prefill (it
    declared support, and answered 400) is no longer offered one, so the walk goes on to the
    next route that takes it while there is time (None: none continued)."""
    while True:
        known = prefill_state.refused_prefill(engine)
        try:
            return await walk_routes(engine, call, call.report.requested_group, prefilled, kwargs)
        except Exception:
            newly = prefill_state.settle_refusals(engine, call, before) - known
            if not newly or _out_of_time(engine, call):
                return None


def cancelled(engine: Engine, call: CallState) -> None:
    """Publish the call's report as ``cancelled``: its caller left while the call was going on
    elsewhere after a broken stream (nothing else publishes it: the walks were tentative)."""
    _publish_end(engine, call, "cancelled")


def _publish_end(engine: Engine, call: CallState, outcome: Outcome) -> None:
    """The call ended during a recovery (the walks were tentative): its report, published once."""
    r = call.report
    r.outcome = outcome
    r.total_latency_s = engine.clock.wall() - r.started_at
    engine.emit(call, r)


def _unstreamed(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The request's arguments for asking again without streaming."""
    return {k: v for k, v in kwargs.items() if k not in ("stream", "stream_options")}


async def _from_scratch(
    engine: Engine,
    call: CallState,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
    later: tuple[frozenset[str], ...],
    whole: bool,
) -> Any:
    """The caller's own request again on a remaining route (None: nowhere answered). The
    deployments in ``later`` go last, tier by tier: elsewhere first, then the first tier (those
    that just refused a prefill: healthy but for it), then the next (seamless: those that broke).
    ``whole``: not streamed."""
    tiers = [tier for tier in later if tier]
    for tier in tiers:
        for dep in tier:
            call.avoid(dep)
    requested = call.report.requested_group
    call.tentative = True  # a walk that fails does not end the call: give_up publishes once
    call.stream = not whole
    try:
        try:
            return await walk_routes(engine, call, requested, messages, kwargs)
        except Exception:
            pass
        for tier in tiers:
            if _out_of_time(engine, call):
                return None
            call.never_again = call.never_again - tier  # allowed back: a last resort
            try:
                return await walk_routes(engine, call, requested, messages, kwargs)
            except Exception:
                continue
        return None
    finally:
        call.tentative = False
        call.stream = True
