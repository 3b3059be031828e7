"""What every non-chat operation does alike on the engine, over real HTTP to the simulator: one
request with LiteLLM's type and a report, an outage tripping the breaker into a fallback group, a
silent provider bounded by the attempt timeout, a budget refusing before any request. (Each
operation's own cases: test_endpoints.py, test_audio_endpoints.py; the table: _operations.py.)"""

from __future__ import annotations

import time

import pytest

from llm_resilience_plugin import BudgetExceededError, get_report
from llm_resilience_plugin.cost import Budget, CostGuard
from llm_resilience_plugin.errors import ErrorClass
from llm_resilience_plugin.testing import Clock, Fault

from ._operations import (
    ENDPOINTS,
    MODELS,
    TYPES,
    call_for,
)

OPERATIONS = list(MODELS)
EACH = pytest.mark.parametrize("operation", OPERATIONS)


@EACH
async def test_healthy_call_is_one_request_with_litellms_type_and_a_report(build, sim, operation):
    router = build(operation, {"g": ["a"]})
    resp = await call_for(router, operation)("g")
    assert isinstance(resp, TYPES[operation])
    assert sim.count("a") == 1
    rep = get_report(resp)
    assert rep is not None and rep.outcome == "success" and rep.deployment_id == "a"
    assert rep.upstream_requests == 1
    if operation in ENDPOINTS and operation != "image_generation":
        assert rep.usage is not None and rep.usage["prompt_tokens"] > 0
    if operation not in ENDPOINTS:
        assert rep.operation == operation
    assert "sk-sim-secret" not in repr(rep)


@EACH
async def test_an_outage_trips_the_breaker_and_falls_back_to_another_group(build, sim, operation):
    router = build(
        operation,
        {"g": ["a"], "backup": ["b"]},
        fallbacks=[{"g": ["backup"]}],
        policy={"breaker": {"fail_max": 2}},
    )
    sim.outage("a", 60)
    call = call_for(router, operation)
    served = [get_report(await call("g")).served_group for _ in range(4)]  # type: ignore[union-attr]
    assert served == ["backup"] * 4
    assert router.breakers()["a"]["state"] == "open"
    sent = sim.count("a")
    await call("g")
    assert sim.count("a") == sent  # an open breaker sends nothing


@EACH
async def test_a_silent_provider_is_bounded_by_the_attempt_timeout(build, sim, operation):
    router = build(
        operation,
        {"g": ["a"], "backup": ["b"]},
        fallbacks=[{"g": ["backup"]}],
        policy={"deadline": 5, "attempt_timeout": 1},
        clock=Clock(),
    )
    sim.set_default("a", Fault.silence(max_hold=10))
    t0 = time.monotonic()
    resp = await call_for(router, operation)("g")
    assert time.monotonic() - t0 < (2.5 if operation in ENDPOINTS else 3)
    rep = get_report(resp)
    assert rep is not None and rep.served_group == "backup"
    assert rep.attempts[0].error_class is ErrorClass.TIMEOUT
    if operation in ENDPOINTS:
        assert sim.count("a") == 1


@EACH
async def test_a_budget_too_small_refuses_before_any_request(build, sim, operation):
    guard = CostGuard([Budget.per_request(1e-9)])
    router = build(operation, {"g": ["a"]}, guards=[guard])
    call = call_for(router, operation)
    if operation == "moderation":  # free: nothing to refuse
        await call("g")
        assert sim.count() == 1
        return
    with pytest.raises(BudgetExceededError):
        await (call("g", max_tokens=50) if operation == "text_completion" else call("g"))
    assert sim.count() == 0
