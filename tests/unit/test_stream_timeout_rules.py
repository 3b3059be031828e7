"""The stream timeouts as docs/streaming.md states them: a static default while the call can go
elsewhere, learned from the group's streams (HEADROOM x p95, at least FLOOR, at most the attempt
timeout) once MIN_SAMPLES are known, the attempt timeout when the call has nowhere else to go, a
configured value used as it is; ``llm-resilience check`` labels the learned ones."""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience_plugin._engine.clock import Deadline
from llm_resilience_plugin._engine.core import CallState, split_options
from llm_resilience_plugin._engine.engine import Engine
from llm_resilience_plugin._engine.learned import FLOOR, HEADROOM, MIN_SAMPLES
from llm_resilience_plugin.errors import ConfigError
from llm_resilience_plugin.events import CallReport, DeploymentInfo
from llm_resilience_plugin.policy import build_spec
from llm_resilience_plugin.testing import FakeClock


def _engine(**policy: Any) -> Engine:
    """primary: two deployments and a fallback (somewhere else to go); backup: one, no fallback."""
    model_list = [
        {"model_name": g, "litellm_params": {"model": "openai/gpt-4o-mini"}, "model_info": {"id": d}}
        for g, d in [("primary", "a"), ("primary", "b"), ("backup", "c")]
    ]
    spec = build_spec(
        model_list,
        policy={"deadline": 60, "attempt_timeout": 30, **policy},
        fallbacks=[{"primary": ["backup"]}],
    )
    deployments = {
        d["model_info"]["id"]: DeploymentInfo(
            d["model_info"]["id"], d["model_name"], "openai/gpt-4o-mini", None
        )
        for d in spec.model_list
    }
    return Engine(spec, deployments, clock=FakeClock(), seed=7, guards=[])


def _call(engine: Engine, group: str, **options: Any) -> CallState:
    opts, _ = split_options(dict(options))
    report = CallReport("s", group, True, engine.clock.wall())
    return CallState("s", report, Deadline.after(engine.clock, 60), True, None, None, opts=opts)


def _learn(engine: Engine, group: str, gap: float, n: int = MIN_SAMPLES) -> None:
    for _ in range(n):
        engine.timings[group].observe_gap(gap)


def test_the_idle_timeout_is_the_static_default_until_enough_streams_then_learned() -> None:
    engine = _engine()
    call = _call(engine, "primary", recover_streams=True)
    assert engine.policies["primary"].stream_idle_timeout == 10.0  # what effective_policy shows
    _learn(engine, "primary", 0.5, MIN_SAMPLES - 1)
    assert engine.idle_timeout(call, "primary") == 10.0  # one stream short: still the default
    _learn(engine, "primary", 0.5, 1)
    assert engine.idle_timeout(call, "primary") == pytest.approx(HEADROOM * 0.5)
    assert engine.policies["primary"].stream_idle_timeout == 10.0  # the static value, unchanged


def test_fast_streams_learn_the_floor_and_slow_ones_are_capped_by_the_attempt_timeout() -> None:
    engine = _engine()
    _learn(engine, "primary", 0.001)  # a fast group (the simulator's streams)
    assert engine.idle_timeout(_call(engine, "primary", recover_streams=True), "primary") == FLOOR == 1.0
    slow = _engine()
    _learn(slow, "primary", 20.0)
    assert slow.idle_timeout(_call(slow, "primary", recover_streams=True), "primary") == 30.0
    assert (
        slow.idle_timeout(_call(slow, "primary", recover_streams=True, attempt_timeout=12), "primary") == 12.0
    )


def test_with_nowhere_else_to_go_the_idle_limit_is_the_attempt_timeout() -> None:
    engine = _engine()
    backup = _call(engine, "backup")  # one deployment, no fallback
    assert engine.idle_timeout(backup, "backup") == 30.0  # not the 10 s static default
    _learn(engine, "backup", 0.001)
    assert engine.idle_timeout(backup, "backup") == 30.0  # nor the learned 1 s
    assert engine.idle_timeout(_call(engine, "backup", attempt_timeout=12), "backup") == 12.0
    primary = _call(engine, "primary", recover_streams=True)
    primary.avoid("a")  # a deployment this call may not use again: b is its last route
    assert engine.first_chunk_timeout(primary, "primary") == 10.0  # the fallback is still there
    _learn(engine, "primary", 0.001)
    assert engine.idle_timeout(primary, "primary") == 1.0


def test_the_idle_timeout_is_learned_only_for_a_stream_whose_break_is_recovered() -> None:
    """Without recovery a cut ends the caller's answer (a visible failure after paid tokens), so a
    healthy pause must not be cut early: the static default stays, however fast the group is."""
    engine = _engine()
    _learn(engine, "primary", 0.001)
    assert engine.idle_timeout(_call(engine, "primary"), "primary") == 10.0  # recovery off (default)
    assert engine.idle_timeout(_call(engine, "primary", recover_streams=False), "primary") == 10.0
    assert engine.idle_timeout(_call(engine, "primary", recover_streams=True), "primary") == FLOOR
    # a caller that recovers a broken stream itself says so (recovered_by_caller): learned
    assert engine.idle_timeout(_call(engine, "primary", recovered_by_caller=True), "primary") == FLOOR
    switched = _engine(restart_broken_streams=True)  # the router's switch, for every call
    _learn(switched, "primary", 0.001)
    assert switched.idle_timeout(_call(switched, "primary"), "primary") == FLOOR
    with pytest.raises(ConfigError, match="recovered_by_caller"):
        split_options({"recovered_by_caller": "yes"})


def test_no_learned_idle_limit_once_the_restart_cap_leaves_nothing_to_recover() -> None:
    """Recovery asked for (``recover_streams="answer"``, as the chat model's invoke does) but the
    policy's cap reached - or zero: a cut would end the answer, so the static default stays."""
    engine = _engine()
    _learn(engine, "primary", 0.001)
    answer = _call(engine, "primary", recover_streams="answer")
    assert engine.idle_timeout(answer, "primary") == FLOOR
    answer.report.stream_restarts = engine.policies["primary"].max_stream_restarts
    assert engine.idle_timeout(answer, "primary") == 10.0
    capped = _engine(max_stream_restarts=0)
    _learn(capped, "primary", 0.001)
    assert capped.idle_timeout(_call(capped, "primary", recover_streams="answer"), "primary") == 10.0


def test_a_configured_idle_timeout_is_used_as_it_is() -> None:
    engine = _engine(stream_idle_timeout=4)
    assert not engine.policies["primary"].learn_idle_timeouts
    _learn(engine, "primary", 0.001)
    _learn(engine, "backup", 0.001)
    assert engine.idle_timeout(_call(engine, "primary"), "primary") == 4
    assert engine.idle_timeout(_call(engine, "backup"), "backup") == 4  # also with nowhere else to go
    assert engine.idle_timeout(_call(engine, "primary", stream_idle_timeout=2.5), "primary") == 2.5


def test_check_labels_the_learned_timeouts_as_static_defaults() -> None:
    from llm_resilience_plugin.cli import stream_timeouts_line

    learned = _engine().policies["primary"].model_dump(mode="json")
    line = stream_timeouts_line(learned)
    assert line.startswith("first chunk 10.0s*, idle 10.0s* (*static default")
    assert f"after {MIN_SAMPLES}" in line and "nowhere else to go" in line
    fixed = _engine(first_chunk_timeout=7, stream_idle_timeout=4).policies["primary"].model_dump(mode="json")
    assert stream_timeouts_line(fixed) == "first chunk 7.0s, idle 4.0s"


def test_litellm_gets_the_whole_attempt_limit_for_a_stream_and_the_watchdog_the_first_chunk() -> None:
    """LiteLLM's timeout is also every later read's: were it the (learned, short) first-chunk
    limit, a healthy pause between chunks longer than that would be cut by the HTTP client, not
    judged by the idle timeout. The watchdog holds the first chunk's limit exactly."""
    from llm_resilience_plugin._engine.attempts import begin

    engine = _engine()
    engine.dispatcher = None
    for _ in range(MIN_SAMPLES):
        engine.timings["primary"].observe_ttft(0.01)  # fast first tokens: the 1 s floor is learned
    call = _call(engine, "primary")
    actx, sent, bound, _, _ = begin(engine, call, "primary", 0)
    assert actx.timeout_s == bound == FLOOR  # the first chunk: the watchdog's, exact
    assert sent == 30.0  # LiteLLM (every read): the attempt timeout
    plain = _call(engine, "primary")
    plain.stream = False
    _, sent_plain, _, _, _ = begin(engine, plain, "primary", 0)
    assert sent_plain == 30.0  # a non-stream attempt is unchanged (nothing learned here)
