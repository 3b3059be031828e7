"""What the gauges read, without a socket: hedge winners from attempt times, and cost-budget rows
(scoped budgets collapsed to one series unless scope values are asked for)."""

from __future__ import annotations

from typing import Any

from llm_resilience_plugin.cost import Budget
from llm_resilience_plugin.cost._ledger import KeyUsage
from llm_resilience_plugin.events import AttemptRecord, CallReport
from llm_resilience_plugin.observability._gauges import BudgetRow, budget_rows_of, hedge_won


def _attempt(n: int, dep: str, outcome: Any, start: float, latency: float, group: str = "g") -> AttemptRecord:
    return AttemptRecord("c", n, group, dep, 0, outcome, None, None, None, start, latency, 0.0)


def _report(*attempts: AttemptRecord, hedged: bool = True, outcome: Any = "success") -> CallReport:
    r = CallReport("c", "g", False, 0.0, hedged=hedged, outcome=outcome)
    r.attempts.extend(attempts)
    return r


def test_the_hedge_won_when_the_answer_overlapped_an_earlier_attempt() -> None:
    # the first attempt (a) started at 10.0 and was cancelled at 10.25; the hedge (b) answered
    race = _report(_attempt(2, "b", "success", 10.05, 0.15), _attempt(2, "a", "cancelled", 10.0, 0.25))
    assert hedge_won(race) == "g"


def test_the_first_attempt_won_or_nothing_was_hedged() -> None:
    first_won = _report(_attempt(1, "a", "success", 10.0, 0.1), _attempt(2, "b", "cancelled", 10.05, 0.05))
    assert hedge_won(first_won) is None
    retried = _report(_attempt(1, "a", "failure", 10.0, 0.1), _attempt(2, "b", "success", 10.1, 0.1))
    assert hedge_won(retried) is None  # a sequential retry, not a race
    assert hedge_won(_report(_attempt(1, "a", "success", 10.0, 0.1), hedged=False)) is None
    assert hedge_won(_report(_attempt(1, "a", "failure", 10.0, 0.1), outcome="failure")) is None


def test_scoped_budgets_collapse_unless_scope_values_are_asked() -> None:
    budgets = [Budget.daily(1.0), Budget.scoped("tenant", 0.5), Budget.per_request(0.1), Budget.monthly(9)]
    usages = [
        KeyUsage("daily", "", "2026-12-01", 0.3, 0.1, 1.0),
        KeyUsage("tenant/day", "tenant=acme", "2026-12-01", 0.2, 0.0, 0.5),
        KeyUsage("tenant/day", "tenant=beta", "2026-12-01", 0.1, 0.0, 0.5),
    ]
    assert budget_rows_of(budgets, usages, scope_values=False) == [
        BudgetRow("daily", "day", "", 0.3, 0.6, 1.0),
        BudgetRow("tenant/day", "day", "tenant", 0.2 + 0.1, 0.3, 0.5),  # summed; the tightest left
        BudgetRow("monthly", "month", "", 0.0, 9.0, 9.0),  # nothing spent yet this month
    ]
    per_value = budget_rows_of(budgets, usages, scope_values=True)
    assert [(r.budget, r.scope) for r in per_value] == [
        ("daily", ""),
        ("tenant/day", "tenant=acme"),
        ("tenant/day", "tenant=beta"),
        ("monthly", ""),
    ]
