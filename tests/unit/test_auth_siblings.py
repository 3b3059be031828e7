"""The sibling-first rule, socket-free: an auth or quota failure is tried once on each other free
deployment of the group (no retry-budget token, no backoff) before the group gives up."""

from __future__ import annotations

import random

import tenacity

from llm_resilience_plugin._engine.clock import Clock, Deadline
from llm_resilience_plugin._engine.retry import AttemptFailed, GroupRetryState, RetryBudget
from llm_resilience_plugin.errors import ErrorClass, Failure
from llm_resilience_plugin.policy import ResiliencePolicy, RetryBudgetPolicy


def _state(free: list[bool], *, auth_action: str = "failover") -> GroupRetryState:
    policy = ResiliencePolicy.model_validate({"classes": {"auth": {"action": auth_action}}}).for_group(None)
    budget = RetryBudget(RetryBudgetPolicy(capacity=1.0))
    budget.on_failure()  # empty: a retry would be refused
    return GroupRetryState(
        policy=policy,
        budget=budget,
        deadline=Deadline.after(Clock(), 30),
        rng=random.Random(1),
        earliest_free=lambda: 0.0,
        fresh_elsewhere=lambda: free.pop(0) if free else False,
    )


def _auth(status: int = 401) -> AttemptFailed:
    return AttemptFailed(Failure(ErrorClass.AUTH, status, "invalid key", None, RuntimeError()), "a")


def test_an_auth_failure_goes_to_a_free_sibling_without_a_budget_token() -> None:
    state = _state([True])
    assert state.should_retry(_auth()) is True
    rs = tenacity.RetryCallState(None, None, (), {})
    rs.attempt_number = 1
    rs.outcome = tenacity.Future(1)
    rs.outcome.set_exception(_auth())
    assert _state([True, True]).wait(rs) == 0.0  # no backoff: the sibling is fresh


def test_with_no_sibling_left_the_group_gives_up_and_fails_over() -> None:
    state = _state([False])
    assert state.should_retry(_auth(403)) is False
    assert state.gave_up_reason == "auth is not retried (failover)"


def test_an_auth_class_configured_to_fail_never_tries_a_sibling() -> None:
    assert _state([True], auth_action="fail").should_retry(_auth()) is False
