"""How a call goes on after its stream broke with content already shown: the decisions (may it
recover, continue by prefill or start over, answer whole) and the walks that do it, all on the
call's own state - one deadline, one report, the deployments it ruled out.

Three ways on, by the call's ``recover_streams`` (else the policy's switches):

* ``continue``: an assistant prefill holding all the text shown, where the route supports it
  (``continue_streams_with_prefill``); the answer goes on where it stopped.
* ``restart``: the caller's own request again, streamed, on a remaining route.
* ``answer`` (``recover_streams="answer"``, for callers that aggregate the stream, such as the
  chat model's ``invoke``): the request again without streaming; the whole answer is handed
  over in the :class:`StreamRestart` marker.

A prefill refused with a bad request is never surfaced (see :mod:`._engine.prefill`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from llm_resilience_plugin._engine import prefill as prefill_state
from llm_resilience_plugin._engine.core import router_resumes
from llm_resilience_plugin._engine.drivers import walk_routes
from llm_resilience_plugin.errors import Failure
from llm_resilience_plugin.events import Outcome, StreamRestart

if TYPE_CHECKING:
    from llm_resilience_plugin._engine.attempt import AttemptContext
    from llm_resilience_plugin._engine.core import CallState
    from llm_resilience_plugin._engine.engine import Engine

ANSWER: Literal["answer"] = "answer"
"""``recover_streams`` value: recover a broken stream by asking again without streaming."""


@dataclass(frozen=True, slots=True)
class Recovered:
    """How the call goes on: the marker the caller sees, and the new stream (``continue``,
    ``restart``) or the whole answer (``answer``, also in ``marker.response``)."""

    marker: StreamRestart
    result: Any


def may_recover(engine: Engine, call: CallState) -> bool:
    """Is a break after content recovered for this call: recovery on (the call's
    ``recover_streams``, else the policy's switches) and the policy's restart cap not reached?"""
    return router_resumes(call, engine.policies[call.report.requested_group])


def may_prefill(
    engine: Engine, call: CallState, kwargs: Mapping[str, Any], shown: str, saw_tools: bool
) -> bool:
    """May the answer be continued by an assistant prefill of ``shown``? Only for chat, with text
    shown, no tool call begun, and no format or forced tool the continuation could break."""
    constrained = "response_format" in kwargs or kwargs.get("tool_choice") not in (None, "auto", "none")
    return (
        engine.policies[call.report.requested_group].continue_streams_with_prefill
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
    requested = call.report.requested_group
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
        try:
            nxt = await walk_routes(engine, call, requested, [*messages, prefill], kwargs)
        except Exception:
            nxt = None  # refused or nowhere to continue: start over instead
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
        engine, call, messages, _unstreamed(kwargs) if whole else kwargs, refusers, whole
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
    refusers: frozenset[str],
    whole: bool,
) -> Any:
    """The caller's own request again on a remaining route (None: nowhere answered). The
    deployments that just refused a prefill go last: elsewhere first, then them. ``whole``: not
    streamed (the answer is published as the call's end by the walk)."""
    for dep in refusers:
        call.avoid(dep)
    requested = call.report.requested_group
    call.tentative = True  # a walk that fails does not end the call: give_up publishes once
    call.stream = not whole
    try:
        try:
            return await walk_routes(engine, call, requested, messages, kwargs)
        except Exception:
            if not refusers or _out_of_time(engine, call):
                return None
        call.never_again = call.never_again - refusers  # healthy but for the prefill: last resort
        try:
            return await walk_routes(engine, call, requested, messages, kwargs)
        except Exception:
            return None
    finally:
        call.tentative = False
        call.stream = True
