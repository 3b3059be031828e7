"""The decision core and its async driver, with a scripted dispatcher and a fake clock: no sockets.

The dispatcher is the test seam (like an httpx transport): each attempt takes the next scripted
outcome for its group — an exception the provider would raise, or an answer from a deployment.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import litellm
import pytest

from llm_resilience_plugin._engine.attempt import AttemptContext
from llm_resilience_plugin._engine.clock import Deadline
from llm_resilience_plugin._engine.core import (
    CallState,
    attempt_timeouts,
    final_error,
    next_route,
    split_options,
)
from llm_resilience_plugin._engine.drivers import walk_routes
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin.errors import (
    AllRoutesFailedError,
    ConfigError,
    DeadlineExceededError,
    ErrorClass,
    Failure,
)
from llm_resilience_plugin.events import AttemptRecord, CallReport, DeploymentInfo
from llm_resilience_plugin.policy import build_spec
from llm_resilience_plugin.testing import FakeClock

MSG = [{"role": "user", "content": "hi"}]


def _spec(**policy: Any) -> Any:
    model_list = [
        {"model_name": g, "litellm_params": {"model": "openai/gpt-4o-mini"}, "model_info": {"id": d}}
        for g, d in [("primary", "a"), ("primary", "b"), ("backup", "c")]
    ]
    pol = {"deadline": 10, "attempt_timeout": 2, "backoff": {"initial": 0.01, "maximum": 0.05}, **policy}
    return build_spec(model_list, policy=pol, fallbacks=[{"primary": ["backup"]}])


def _err(status: int) -> Exception:
    if status == 429:
        return litellm.RateLimitError("slow down", llm_provider="openai", model="m")
    if status == 400:
        return litellm.BadRequestError("bad", llm_provider="openai", model="m")
    return litellm.InternalServerError("boom", llm_provider="openai", model="m")


class ScriptedDispatcher:
    """Each attempt for a group takes the next (deployment, outcome) from its script."""

    def __init__(self, scripts: dict[str, list[tuple[str, Any]]]) -> None:
        self.scripts = {g: deque(s) for g, s in scripts.items()}
        self.sent: list[tuple[str, str]] = []

    async def send(
        self, attempt: AttemptContext, messages: Any, kwargs: Any, *, timeout_s: float, bound: float
    ) -> Any:
        dep, outcome = self.scripts[attempt.group].popleft()
        attempt.pick(dep)
        attempt.sent = True
        self.sent.append((attempt.group, dep))
        if isinstance(outcome, BaseException):
            raise outcome
        return litellm.ModelResponse(model="gpt-4o-mini", choices=[{"message": {"content": outcome}}])

    def wrap_stream(self, *args: Any) -> Any:  # pragma: no cover - no streams here
        raise AssertionError("not a stream test")

    def static_stream(self, response: Any, call: Any) -> Any:  # pragma: no cover
        raise AssertionError("not a stream test")

    def annotate(self, report: CallReport, result: Any, usage: dict[str, int] | None) -> None:
        report.served_model = result.model

    async def discard(self, result: Any) -> None:  # pragma: no cover
        return None


def _engine(
    scripts: dict[str, list[tuple[str, Any]]], **policy: Any
) -> tuple[Engine, ScriptedDispatcher, FakeClock]:
    spec = _spec(**policy)
    deployments = {
        d["model_info"]["id"]: DeploymentInfo(
            d["model_info"]["id"], d["model_name"], "openai/gpt-4o-mini", None
        )
        for d in spec.model_list
    }
    clock = FakeClock()
    engine = Engine(spec, deployments, clock=clock, seed=7, guards=[])
    engine.dispatcher = dispatcher = ScriptedDispatcher(scripts)
    return engine, dispatcher, clock


def _call(engine: Engine, deadline: float = 10.0) -> CallState:
    report = CallReport("c1", "primary", False, engine.clock.wall())
    return CallState("c1", report, Deadline.after(engine.clock, deadline), False, None, None)


async def test_retries_in_the_group_then_answers() -> None:
    engine, disp, clock = _engine({"primary": [("a", _err(500)), ("b", _err(503)), ("a", "ok")]})
    call = _call(engine)
    resp = await walk_routes(engine, call, "primary", MSG, {})
    assert resp.choices[0].message.content == "ok"
    assert disp.sent == [("primary", "a"), ("primary", "b"), ("primary", "a")]
    assert [a.outcome for a in call.report.attempts] == ["failure", "failure", "success"]
    assert call.report.served_group == "primary" and call.report.fallback_level == 0
    assert len(clock.slept) == 2  # two backoff sleeps, taken instantly by the fake clock
    assert engine.breakers["a"].snapshot()["fail_counter"] == 0  # the success reset it


async def test_exhausted_group_fails_over_to_the_chain() -> None:
    engine, disp, _ = _engine({"primary": [("a", _err(500))] * 3, "backup": [("c", "from backup")]})
    call = _call(engine)
    resp = await walk_routes(engine, call, "primary", MSG, {})
    assert resp.choices[0].message.content == "from backup"
    assert disp.sent[-1] == ("backup", "c")
    assert call.report.served_group == "backup" and call.report.fallback_level == 1


async def test_caller_error_is_raised_as_itself_and_never_counts_against_the_deployment() -> None:
    engine, disp, _ = _engine({"primary": [("a", _err(400))]})
    call = _call(engine)
    with pytest.raises(litellm.BadRequestError):
        await walk_routes(engine, call, "primary", MSG, {})
    assert disp.sent == [("primary", "a")]  # not retried, no fallback
    assert engine.breakers["a"].snapshot()["fail_counter"] == 0


async def test_everything_failing_lists_every_attempt() -> None:
    engine, _, _ = _engine({"primary": [("a", _err(500))] * 3, "backup": [("c", _err(500))] * 3})
    call = _call(engine)
    with pytest.raises(AllRoutesFailedError) as info:
        await walk_routes(engine, call, "primary", MSG, {})
    assert len(info.value.attempts) == 6 and all(isinstance(a, AttemptRecord) for a in info.value.attempts)
    assert isinstance(info.value.__cause__, litellm.InternalServerError)


def _failure(cls: ErrorClass, exc: BaseException | None = None) -> Failure:
    return Failure(cls, None, str(cls), None, exc or RuntimeError(str(cls)))


def test_next_route_follows_the_chain_and_the_policy() -> None:
    engine, _, _ = _engine({})
    call = _call(engine)
    pol = engine.policies["primary"]
    chain = ["backup", "other"]
    server = _failure(ErrorClass.SERVER)
    assert next_route(call, engine.policy, pol, chain, server, ["primary"]) == "backup"
    assert next_route(call, engine.policy, pol, chain, server, ["primary", "backup"]) == "other"
    assert next_route(call, engine.policy, pol, [], server, ["primary"]) is None
    # A class whose action is "fail" never falls back.
    assert next_route(call, engine.policy, pol, chain, _failure(ErrorClass.BAD_REQUEST), ["primary"]) is None
    # No time left for another attempt: stop.
    late = _call(engine, deadline=engine.policy.min_attempt_time / 2)
    assert next_route(late, engine.policy, pol, chain, server, ["primary"]) is None


def test_final_error_prefers_the_providers_own_error_then_the_deadline() -> None:
    engine, _, clock = _engine({})
    call = _call(engine, deadline=1.0)
    bad = litellm.BadRequestError("bad", llm_provider="openai", model="m")
    call.failures = [_failure(ErrorClass.SERVER), _failure(ErrorClass.BAD_REQUEST, bad)]
    assert final_error(call, engine.policy.min_attempt_time) is bad
    call.failures = [_failure(ErrorClass.CIRCUIT_OPEN), _failure(ErrorClass.SERVER)]
    err = final_error(call, engine.policy.min_attempt_time)
    assert type(err) is AllRoutesFailedError and err.__cause__ is call.failures[1].exception
    clock.advance(2.0)
    assert isinstance(final_error(call, engine.policy.min_attempt_time), DeadlineExceededError)


def test_attempt_timeouts_round_a_deadlines_rest_but_keep_the_exact_bound() -> None:
    assert attempt_timeouts(30.0, 100.0) == (30.0, 30.0, 30.25)  # configured: sent as it is
    timeout, sent, bound = attempt_timeouts(30.0, 7.3)  # the deadline's rest: coarse for LiteLLM
    assert (timeout, sent, bound) == (7.3, 8.0, 7.3)
    assert attempt_timeouts(30.0, 0.33)[1] == pytest.approx(0.4)


def test_a_learned_limit_reaches_litellm_coarse_and_the_watchdog_holds_it_exactly() -> None:
    """LiteLLM builds an SDK client (a connection pool) per timeout value: a limit learned from
    answer times is new every few answers, so it is sent rounded up, never above the cap."""
    assert attempt_timeouts(1.41, 100.0, cap=30.0) == (1.41, 2.0, 1.41)
    assert attempt_timeouts(1.0, 100.0, cap=30.0) == (1.0, 1.0, 1.25)  # already on the grid
    assert attempt_timeouts(29.5, 100.0, cap=30.0)[1] == 30.0  # never above the configured timeout
    assert attempt_timeouts(2.7, 1.2, cap=30.0) == (1.2, 2.0, 1.2)  # the deadline's rest, coarse
    assert attempt_timeouts(30.0, 100.0, cap=None) == (30.0, 30.0, 30.25)  # configured: as it is


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attempt_timeout": -1}, "attempt_timeout"),
        ({"timeout": 0}, "timeout"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"priority": 3}, "priority"),
        ({"scenario": 1}, "scenario"),
        ({"first_chunk_timeout": True}, "first_chunk_timeout"),
    ],
)
def test_bad_options_name_their_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        split_options(kwargs)
    assert info.value.field == field


def test_options_are_taken_out_of_litellms_kwargs() -> None:
    opts, clean = split_options({"timeout": 3, "temperature": 0, "idempotent": False, "priority": "low"})
    assert clean == {"temperature": 0}
    assert opts.attempt_timeout == 3.0 and not opts.idempotent and opts.priority == "low"
    assert not math.isnan(opts.attempt_timeout)


def _stream_call(engine: Engine) -> CallState:
    report = CallReport("s1", "primary", True, engine.clock.wall())
    return CallState("s1", report, Deadline.after(engine.clock, 60), True, None, None)


def test_stream_timeouts_are_short_while_the_call_can_go_elsewhere_and_learned_after() -> None:
    engine, _, _ = _engine({}, attempt_timeout=30, deadline=60)
    call = _stream_call(engine)
    # primary has two deployments and a fallback: a short static default, not the 30 s attempt
    assert engine.first_chunk_timeout(call, "primary") == 10.0
    assert engine.idle_timeout(call, "primary") == 10.0
    # backup has one deployment and no fallback: nowhere else to go, so waiting is better
    backup = CallState(
        "s2", CallReport("s2", "backup", True, 0.0), Deadline.after(engine.clock, 60), True, None, None
    )
    assert engine.first_chunk_timeout(backup, "backup") == 30.0
    # learned from the group's streams: 4 x the p95 of what it really does
    for _ in range(30):
        engine.timings["primary"].observe_ttft(0.5)
        engine.timings["primary"].observe_gap(0.2)
    assert engine.first_chunk_timeout(call, "primary") == pytest.approx(2.0)
    # the idle limit is learned only for a stream whose break after content is recovered
    assert engine.idle_timeout(call, "primary") == 10.0
    recovered = _stream_call(engine)
    recovered.opts = split_options({"recover_streams": True})[0]
    assert engine.idle_timeout(recovered, "primary") == pytest.approx(1.0)  # never below the 1 s floor


def test_configured_stream_timeouts_are_never_learned_over() -> None:
    engine, _, _ = _engine({}, attempt_timeout=30, first_chunk_timeout=7, stream_idle_timeout=4)
    call = _stream_call(engine)
    for _ in range(30):
        engine.timings["primary"].observe_ttft(0.1)
    assert engine.first_chunk_timeout(call, "primary") == 7
    assert engine.idle_timeout(call, "primary") == 4


def test_non_stream_timeouts_are_learned_from_answer_times_and_capped():
    from llm_resilience_plugin._engine.learned import MIN_SAMPLES, StreamTimings

    t = StreamTimings()
    assert t.answer(30.0) == 30.0  # nothing observed: the attempt timeout
    for _ in range(MIN_SAMPLES):
        t.observe_answer(0.8)
    assert t.answer(30.0) == pytest.approx(3.2)  # 4 x p95
    assert t.answer(2.0) == 2.0  # never above the attempt timeout
    fast = StreamTimings()
    for _ in range(MIN_SAMPLES):
        fast.observe_answer(0.01)
    assert fast.answer(30.0) == 1.0  # never below the floor


def test_calls_held_together_come_back_spread_out_within_the_bound():
    from llm_resilience_plugin._engine.clock import FakeClock
    from llm_resilience_plugin._engine.engine import Engine
    from llm_resilience_plugin.policy import ResiliencePolicy

    engine = Engine(None, {}, clock=FakeClock(), seed=3, guards=[], policy=ResiliencePolicy())
    assert engine.spread_hold(1.0, 3.0) == 1.0  # alone: back when the hold ends
    waits = [engine.spread_hold(1.0, 3.0) for _ in range(200)]  # the others: spread over 1..3 s
    assert all(1.0 <= w <= 3.0 for w in waits) and max(waits) - min(waits) > 1.5
    assert engine.spread_hold(2.0, 2.5) <= 2.5  # never beyond the bound that made waiting right
    engine.clock.advance(10)  # type: ignore[attr-defined]
    assert engine.spread_hold(1.0, 3.0) == 1.0  # the earlier waits are over: alone again
