"""What the OpenTelemetry and Prometheus gauges read when they are collected: each model group's
retry-budget tokens, each cost-guard budget's spend and remaining dollars in its current window,
and whether a hedged call was won by its hedge. Needs neither package.

Budgets are read from the guard's ledger at collection time (a scrape), never on the call path.
A scoped budget (per tenant, user, ...) is one series by default - spend summed over its scope
values, remaining the tightest value's - so tenants never become labels unless asked
(``scope_values=True``: one series per value, ``scope="tenant=acme"``). Per-request and per-run
budgets belong to one call or run: they are not gauges.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_resilience_plugin.events import CallReport

log = logging.getLogger("llm_resilience.observability")


@dataclass(frozen=True, slots=True)
class RetryBudgetRow:
    """One model group's retry budget: tokens now and the bucket's capacity."""

    group: str
    tokens: float
    capacity: float


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """One cost budget (one scope value when asked) in its current window, in dollars."""

    budget: str
    period: str
    scope: str  # "" global; the scope key ("tenant") summed over values; "tenant=acme" per value
    spent: float
    remaining: float
    limit: float


@dataclass(frozen=True, slots=True)
class PaceRow:
    """One deployment's pace: calls queued for a slot, its limit (requests a minute; 0 when none
    is known) and the slots granted so far."""

    group: str
    deployment: str
    queued: int
    limit_rpm: float
    granted: int


def pace_rows(router: Any) -> list[PaceRow]:
    """Every deployment's pace (routers without pacing: none)."""
    paces = getattr(router, "paces", None)
    if paces is None:
        return []
    groups = {d.id: d.model_group for d in router.deployments()}
    return [
        PaceRow(groups.get(dep, ""), dep, int(s["queued"]), float(s["rpm"] or 0.0), int(s["granted"]))
        for dep, s in paces().items()
    ]


def retry_budget_rows(router: Any) -> list[RetryBudgetRow]:
    """Every model group's retry-budget level (groups whose budget is disabled included)."""
    rows: list[RetryBudgetRow] = []
    for group in router.model_groups:
        budget = router.retry_budget(group)
        rows.append(RetryBudgetRow(group, float(budget.tokens), float(budget.policy.capacity)))
    return rows


def budget_rows(router: Any, *, scope_values: bool = False) -> list[BudgetRow]:
    """Spend and remaining dollars of every day/month/total budget of the router's cost guards.

    A ledger that cannot answer (Redis down) is logged at debug level and skipped: a scrape never
    fails because of it."""
    rows: list[BudgetRow] = []
    for guard in getattr(router, "guards", ()):
        budget_set, ledger = getattr(guard, "budget_set", None), getattr(guard, "ledger", None)
        if budget_set is None or ledger is None:
            continue
        try:
            usages = budget_set.window_usage(ledger)
        except Exception:
            log.debug("budget usage unavailable for metrics", exc_info=True)
            continue
        rows.extend(budget_rows_of(budget_set.budgets, usages, scope_values))
    return rows


def budget_rows_of(budgets: Iterable[Any], usages: Iterable[Any], scope_values: bool) -> list[BudgetRow]:
    """The rows of ``budgets`` given their current-window ``usages`` (ledger ``KeyUsage`` rows)."""
    by_name: dict[str, list[Any]] = {}
    for u in usages:
        by_name.setdefault(u.budget, []).append(u)
    rows: list[BudgetRow] = []
    for b in budgets:
        if b.period in ("request", "run"):
            continue
        seen = by_name.get(b.name, [])
        if b.scope is None or scope_values:
            if not seen and b.scope is None:  # nothing spent yet this window
                rows.append(BudgetRow(b.name, b.period, "", 0.0, float(b.limit), float(b.limit)))
            for u in seen:
                rows.append(BudgetRow(b.name, b.period, u.scope, u.spent, u.remaining, float(b.limit)))
            continue
        spent = sum(u.spent for u in seen)
        remaining = min((u.remaining for u in seen), default=float(b.limit))
        rows.append(BudgetRow(b.name, b.period, b.scope, spent, remaining, float(b.limit)))
    return rows


def hedge_won(report: CallReport) -> str | None:
    """The model group whose hedge answered a hedged call, or None (the first attempt answered,
    or nothing did). The hedge answered when another attempt started before the answering one
    and was still in flight when it started (only a hedge is sent then); a sequential retry
    starts after the attempts before it ended. Read from times, not attempt numbers: a record's
    number is the call's count when it ends, so both sides of a race can carry the same one."""
    if not report.hedged or report.outcome != "success":
        return None
    attempts = report.attempts
    answer = next((a for a in reversed(attempts) if a.outcome == "success"), None)
    if answer is None:
        return None
    for a in attempts:
        if a is answer or a.outcome == "skipped" or a.started_at >= answer.started_at:
            continue
        if a.started_at + a.latency_s > answer.started_at + _OVERLAP_S:
            return answer.model_group
    return None


_OVERLAP_S = 1e-3  # wall start + monotonic latency: a sequential retry may "overlap" by microseconds
