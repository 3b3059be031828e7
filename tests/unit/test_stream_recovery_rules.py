"""The engine's stream-recovery decisions, socket-free: whether and how a break after content is
recovered (the call's ``recover_streams``, else the policy, within ``max_stream_restarts``),
when the answer may be continued by assistant prefill, and when a replay is worth trying."""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience_plugin._engine.clock import Deadline
from llm_resilience_plugin._engine.core import CallState, split_options, stream_recovery_mode
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.stream_recovery import give_up, may_prefill, may_recover, replay_model
from llm_resilience_plugin.errors import ConfigError, ErrorClass, Failure
from llm_resilience_plugin.events import CallReport, DeploymentInfo
from llm_resilience_plugin.policy import build_spec
from llm_resilience_plugin.testing import FakeClock


def _engine(**policy: Any) -> Engine:
    model_list = [
        {"model_name": "primary", "litellm_params": {"model": "openai/gpt-4o-mini"}, "model_info": {"id": d}}
        for d in ("a", "b")
    ]
    spec = build_spec(model_list, policy={"deadline": 60, **policy})
    deployments = {d: DeploymentInfo(d, "primary", "openai/gpt-4o-mini", None) for d in ("a", "b")}
    return Engine(spec, deployments, clock=FakeClock(), seed=7, guards=[])


def _call(engine: Engine, **options: Any) -> CallState:
    opts, _ = split_options(dict(options))
    report = CallReport("s", "primary", True, engine.clock.wall())
    return CallState("s", report, Deadline.after(engine.clock, 60), True, None, None, opts=opts)


@pytest.mark.parametrize(
    ("policy", "options", "expected"),
    [
        ({}, {}, True),  # on by default (seamless)
        ({"recover_broken_streams": False}, {}, False),
        ({"recover_broken_streams": False}, {"recover_streams": "seamless"}, True),
        ({"restart_broken_streams": True}, {}, True),
        ({"continue_streams_with_prefill": True}, {}, True),
        ({"restart_broken_streams": True}, {"recover_streams": False}, False),  # the call says no
        ({}, {"recover_streams": True}, True),
        ({}, {"recover_streams": "answer"}, True),
    ],
)
def test_who_decides_whether_a_break_is_recovered(policy: Any, options: Any, expected: bool) -> None:
    engine = _engine(**policy)
    assert may_recover(engine, _call(engine, **options)) is expected


@pytest.mark.parametrize(
    ("policy", "options", "expected"),
    [
        ({}, {}, "seamless"),
        ({"recover_broken_streams": False}, {}, "off"),
        ({"restart_broken_streams": True}, {}, "restart"),  # the marker protocol, opted in
        ({"continue_streams_with_prefill": True}, {}, "restart"),
        ({}, {"recover_streams": True}, "restart"),
        ({}, {"recover_streams": "restart"}, "restart"),
        ({"restart_broken_streams": True}, {"recover_streams": "seamless"}, "seamless"),
        ({}, {"recover_streams": "answer"}, "answer"),
        ({}, {"recover_streams": False}, "off"),
    ],
)
def test_how_a_break_is_recovered(policy: Any, options: Any, expected: str) -> None:
    engine = _engine(**policy)
    call = _call(engine, **options)
    assert stream_recovery_mode(call.opts, engine.policies["primary"]) == expected


def test_an_unknown_recovery_mode_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"recover_streams.*seamless"):
        split_options({"recover_streams": "resume"})


@pytest.mark.parametrize(
    ("rule", "kwargs", "saw_tools", "expected"),
    [
        ("auto", {}, False, (False, None)),  # sampling (the provider's default temperature)
        ("auto", {"temperature": 0.7}, False, (False, None)),
        ("auto", {"temperature": 0}, False, (True, "openai/gpt-4o-mini")),  # same model only
        ("auto", {"seed": 3}, False, (True, "openai/gpt-4o-mini")),
        ("auto", {"temperature": 0, "n": 2}, False, (False, None)),
        ("auto", {"temperature": 0}, True, (False, None)),  # a tool call is never replayed
        ("always", {}, False, (True, None)),
        ("always", {}, True, (False, None)),
        ("never", {"temperature": 0}, False, (False, None)),
    ],
)
def test_when_a_replay_is_worth_trying(rule: str, kwargs: Any, saw_tools: bool, expected: Any) -> None:
    engine = _engine(replay_broken_streams=rule)
    assert replay_model(engine, _call(engine), kwargs, "a", saw_tools) == expected


def test_the_restart_cap_ends_recovery() -> None:
    engine = _engine(restart_broken_streams=True, max_stream_restarts=2)
    call = _call(engine)
    call.report.stream_restarts = 1
    assert may_recover(engine, call)
    call.report.stream_restarts = 2
    assert not may_recover(engine, call)


@pytest.mark.parametrize(
    ("kwargs", "shown", "saw_tools", "operation", "expected"),
    [
        ({}, "Once upon", False, "completion", True),
        ({}, "", False, "completion", False),  # nothing shown: nothing to continue
        ({}, "Once upon", True, "completion", False),  # a tool call begun
        ({"response_format": {"type": "json_object"}}, "{", False, "completion", False),
        ({"tool_choice": "required"}, "x", False, "completion", False),
        ({"tool_choice": "auto"}, "x", False, "completion", True),
        ({}, "Once upon", False, "text_completion", False),  # prefill is a chat message
    ],
)
def test_when_an_answer_may_be_continued_by_prefill(
    kwargs: Any, shown: str, saw_tools: bool, operation: str, expected: bool
) -> None:
    engine = _engine(continue_streams_with_prefill=True)
    call = _call(engine)
    call.operation = operation
    assert may_prefill(engine, call, kwargs, shown, saw_tools) is expected
    seamless = _engine()  # the default tries a prefill wherever the protocol's switch would
    call = _call(seamless)
    call.operation = operation
    assert may_prefill(seamless, call, kwargs, shown, saw_tools, seamless=True) is expected
    assert not may_prefill(seamless, _call(seamless), kwargs, shown, saw_tools)  # protocol: off
    assert not may_prefill(_engine(), _call(_engine()), kwargs, shown, saw_tools)  # switch off


def test_giving_up_publishes_the_original_failure_once() -> None:
    engine = _engine()
    seen: list[Any] = []
    call = _call(engine)
    call.listener = seen.append
    engine.clock.advance(2.5)  # type: ignore[attr-defined]
    give_up(engine, call, Failure(ErrorClass.CONNECTION, None, "cut", None, ConnectionError("cut")))
    assert seen == [call.report]
    assert call.report.outcome == "failure" and call.report.error_class is ErrorClass.CONNECTION
    assert call.report.total_latency_s == pytest.approx(2.5, abs=0.05)
