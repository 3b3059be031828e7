"""Assistant prefill, socket-free: which deployments declare it (flag first, then LiteLLM's model
map) and what a refused prefill leaves in a call (see llm_resilience_plugin/_engine/prefill.py)."""

from __future__ import annotations

from typing import Any

import pytest

import llm_resilience_plugin  # noqa: F401 - sets LITELLM_LOCAL_MODEL_COST_MAP before litellm loads
from llm_resilience_plugin._engine import prefill
from llm_resilience_plugin._engine.clock import Deadline
from llm_resilience_plugin._engine.core import CallState
from llm_resilience_plugin.errors import ErrorClass, Failure
from llm_resilience_plugin.events import AttemptRecord, CallReport, DeploymentInfo
from llm_resilience_plugin.testing import FakeClock


def info(model: str, **params: Any) -> DeploymentInfo:
    return DeploymentInfo("d", "g", model, None, {"model": model, **params})


@pytest.mark.parametrize(
    ("model", "expected"),
    [("deepseek/deepseek-chat", True), ("openai/gpt-4o-mini", False), ("no-such/model-xyz", False)],
)
def test_the_model_map_says_which_models_take_a_prefill(model: str, expected: bool) -> None:
    # litellm 1.110 has litellm.utils.supports_assistant_prefill, not litellm.supports_assistant_prefill
    assert info(model).supports_prefill is expected


def test_an_explicit_flag_wins_over_the_model_map_both_ways() -> None:
    assert info("openai/gpt-4o-mini", supports_assistant_prefill=True).supports_prefill is True
    assert info("deepseek/deepseek-chat", supports_assistant_prefill=False).supports_prefill is False


class _Engine:
    """What the prefill bookkeeping reads of an engine: its deployments."""

    def __init__(self, deployments: dict[str, DeploymentInfo]) -> None:
        self.deployments = deployments


def _call(clock: FakeClock) -> CallState:
    report = CallReport("c1", "primary", True, clock.wall())
    return CallState("c1", report, Deadline.after(clock, 10.0), True, None, None)


def _record(dep: str, outcome: Any, error_class: ErrorClass | None, status: int | None) -> AttemptRecord:
    return AttemptRecord("c1", 1, "g", dep, 0, outcome, error_class, status, None, 0.0, 0.0, 0.0)


def _failure(error_class: ErrorClass, status: int | None) -> Failure:
    return Failure(error_class, status, str(error_class), None, RuntimeError(str(error_class)))


def test_a_refused_prefill_leaves_the_calls_failures_and_is_not_offered_again() -> None:
    clock = FakeClock()
    engine: Any = _Engine(
        {
            "a": info("openai/gpt-4o-mini"),
            "b": info("openai/gpt-4o-mini", supports_assistant_prefill=True),
            "c": info("deepseek/deepseek-chat"),
        }
    )
    call = _call(clock)
    broken = _failure(ErrorClass.CONNECTION, None)
    call.add_failure(broken)
    call.report.attempts.append(_record("a", "failure", ErrorClass.CONNECTION, None))
    assert prefill.can_prefill(engine, "b") and prefill.can_prefill(engine, "c")
    assert not prefill.can_prefill(engine, "a")
    before = prefill.mark(call)
    # The prefill walk: b refuses (400), c is down (503, a real failure that stays).
    call.add_failure(_failure(ErrorClass.BAD_REQUEST, 400))
    call.report.attempts.append(_record("b", "failure", ErrorClass.BAD_REQUEST, 400))
    down = _failure(ErrorClass.SERVER, 503)
    call.add_failure(down)
    call.report.attempts.append(_record("c", "failure", ErrorClass.SERVER, 503))

    assert prefill.settle_refusals(engine, call, before) == {"b"}
    assert list(call.failures) == [broken, down]  # nothing left to raise the refusal as itself
    assert len(call.report.attempts) == 3  # the refusal stays on record, as it happened
    assert not prefill.can_prefill(engine, "b") and prefill.can_prefill(engine, "c")
    assert prefill.refused_prefill(engine) == {"b"}
    assert prefill.refused_prefill(_Engine({})) == frozenset()  # per engine, not per process


def test_a_walk_without_a_refusal_changes_nothing() -> None:
    engine: Any = _Engine({"b": info("openai/gpt-4o-mini", supports_assistant_prefill=True)})
    call = _call(FakeClock())
    before = prefill.mark(call)
    call.add_failure(_failure(ErrorClass.TIMEOUT, None))
    call.report.attempts.append(_record("b", "failure", ErrorClass.TIMEOUT, None))
    assert prefill.settle_refusals(engine, call, before) == frozenset()
    assert len(call.failures) == 1 and prefill.can_prefill(engine, "b")
