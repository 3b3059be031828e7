"""The spend rules of an attempt, against CostGuard directly (no sockets): what a timeout, a
drop, a cancel, a cut stream and an HTTP error answer cost, and the ``budget_overrun`` alert of
a provider that bills past the request's ``max_tokens``."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from llm_resilience_plugin.cost import Budget, BudgetAlert, CostGuard, Price, Ticket
from llm_resilience_plugin.cost._hooks import spend_action
from llm_resilience_plugin.errors import ErrorClass, Failure

PRICE = Price(1e-6, 2e-6, "override", None, "m")
CANDS = [("d1", "m", PRICE)]


def failure(error_class: ErrorClass, status: int | None) -> Failure:
    return Failure(error_class, status, "simulated", None, RuntimeError("simulated"))


TIMEOUT = failure(ErrorClass.TIMEOUT, None)
SERVER_500 = failure(ErrorClass.SERVER, 500)
NOT_SENT = failure(ErrorClass.UNKNOWN, None)  # e.g. cancelled before sending: billable=False


@pytest.mark.parametrize(
    ("how", "on_cancel", "expected"),
    [
        (dict(failure=TIMEOUT, billable=True), "estimate", "settle"),
        (dict(failure=TIMEOUT, billable=True), "release", "settle"),  # a timeout is not a cancel
        (dict(failure=SERVER_500), "estimate", "release"),  # an HTTP answer: not billed
        (dict(failure=NOT_SENT), "estimate", "release"),  # nothing was sent
        (dict(billable=True), "estimate", "settle"),  # cancelled in flight
        (dict(billable=True), "release", "release"),  # ... trusted to cost nothing
        (dict(billable=True, produced=True), "release", "settle"),  # content reached the caller
        (dict(billable=True, usage={"prompt_tokens": 3}), "release", "settle"),  # usage known
        (dict(response=object()), "release", "settle"),  # an answer
    ],
)
def test_spend_action_table(how: dict[str, Any], on_cancel: str, expected: str) -> None:
    args = {"failure": None, "response": None, "usage": None, "billable": False, "produced": False, **how}
    assert spend_action(**args, on_cancel=on_cancel) == expected


def guard(**kwargs: Any) -> CostGuard:
    return CostGuard([Budget.daily(1.0)], now=lambda: 1_000_000.0, **kwargs)


def spent(g: CostGuard) -> float:
    (u,) = g.report().budgets
    assert u.reserved == 0
    return u.spent


def ticket(g: CostGuard, max_tokens: int = 100, n: int | None = None) -> Ticket:
    return g.reserve(CANDS, prompt_tokens=100, max_tokens=max_tokens, n=n)


def end(g: CostGuard, t: Ticket, **how: Any) -> None:
    args = {"response": None, "usage": None, "failure": None, **how}
    g.after_attempt(t, deployment_id="d1", **args)


def test_a_timeout_a_cancel_and_a_cut_stream_settle_alike_and_an_answer_releases() -> None:
    g = guard()
    est = g.estimate(CANDS, prompt_tokens=100, max_tokens=100)[0]
    assert est == pytest.approx(100 * 1e-6 + 100 * 2e-6)
    end(g, ticket(g), failure=TIMEOUT, billable=True)  # timed out after sending
    end(g, ticket(g), billable=True)  # cancelled in flight
    end(g, ticket(g), billable=True, produced=True)  # stream cut after content, no usage
    assert spent(g) == pytest.approx(3 * est)
    assert [e.estimated for e in g.ledger.entries()] == [True] * 3
    end(g, ticket(g), failure=SERVER_500, billable=False)  # an HTTP error answer
    end(g, ticket(g), failure=NOT_SENT)  # never sent
    assert spent(g) == pytest.approx(3 * est) and len(g.ledger.entries()) == 3
    # the usage known so far wins over the estimate
    end(g, ticket(g), billable=True, produced=True, usage={"prompt_tokens": 100, "completion_tokens": 7})
    assert spent(g) == pytest.approx(3 * est + 100e-6 + 14e-6)
    g.close()


def test_on_cancel_release_only_releases_a_cancel_that_produced_nothing() -> None:
    g = guard(on_cancel="release")
    est = g.estimate(CANDS, prompt_tokens=100, max_tokens=100)[0]
    end(g, ticket(g), billable=True)  # cancelled, nothing produced: released
    assert spent(g) == 0
    end(g, ticket(g), billable=True, produced=True)  # a stream closed after content
    end(g, ticket(g), failure=TIMEOUT, billable=True)  # a timeout is not a cancel
    assert spent(g) == pytest.approx(2 * est)
    g.close()


def test_an_older_engine_without_the_flags_keeps_the_old_rules() -> None:
    g = guard()
    end(g, ticket(g), failure=TIMEOUT)  # no billable=: released, as before
    assert spent(g) == 0
    end(g, ticket(g))  # no failure, no answer: a cancel, settled at the estimate
    assert spent(g) > 0
    g.close()


def test_billed_past_max_tokens_is_recorded_and_alerted_once(caplog: pytest.LogCaptureFixture) -> None:
    alerts: list[BudgetAlert] = []
    g = guard(on_alert=alerts.append, alert_at=None)  # overruns alert even with no thresholds
    caplog.set_level(logging.WARNING, logger="llm_resilience.cost")
    g.settle(ticket(g, max_tokens=5), prompt_tokens=100, completion_tokens=5, deployment_id="d1")
    g.settle(ticket(g, max_tokens=5, n=2), prompt_tokens=100, completion_tokens=9, deployment_id="d1")
    g.settle(ticket(g, max_tokens=5))  # nothing known: the estimate, no overrun to speak of
    assert alerts == []
    t = ticket(g, max_tokens=5)
    cost = g.settle(t, prompt_tokens=100, completion_tokens=40, deployment_id="d1")
    assert cost == pytest.approx(100e-6 + 40 * 2e-6)  # recorded as billed, above the estimate
    assert cost > t.estimate and g.ledger.entries()[-1].completion_tokens == 40
    (alert,) = alerts
    assert alert.kind == "budget_overrun"
    assert (alert.deployment_id, alert.max_tokens, alert.completion_tokens) == ("d1", 5, 40)
    assert (alert.cost, alert.estimate, alert.request_id) == (cost, t.estimate, t.request_id)
    assert (alert.budget, alert.window, alert.limit) == ("daily", "1970-01-12", 1.0)
    assert alert.spent == pytest.approx(spent(g))
    logged = [r for r in caplog.records if getattr(r, "llm_event_name", None) == "budget_overrun"]
    assert len(logged) == 1 and logged[0].llm_event == alert.to_dict()  # type: ignore[attr-defined]
    assert alert.to_dict()["kind"] == "budget_overrun" and alert.to_dict()["max_tokens"] == 5
    g.settle(t, prompt_tokens=100, completion_tokens=40)  # settled once: no second alert
    assert len(alerts) == 1
    g.close()


def test_an_overrun_alert_callback_failing_does_not_fail_the_settle(caplog: pytest.LogCaptureFixture) -> None:
    def boom(alert: BudgetAlert) -> None:
        raise RuntimeError("alert sink down")

    g = guard(on_alert=boom)
    with caplog.at_level(logging.ERROR, logger="llm_resilience.cost"):
        g.settle(ticket(g, max_tokens=1), prompt_tokens=1, completion_tokens=2, deployment_id="d1")
    assert spent(g) == pytest.approx(1e-6 + 4e-6)
    assert any("on_alert callback failed" in r.getMessage() for r in caplog.records)
    g.close()


def test_a_threshold_alert_keeps_its_shape() -> None:
    alerts: list[BudgetAlert] = []
    g = guard(on_alert=alerts.append, alert_at=0.5)
    g.settle(ticket(g), cost=0.6)
    (alert,) = alerts
    assert alert.kind == "threshold" and alert.threshold == 0.5 and alert.deployment_id is None
    assert set(alert.to_dict()) == {"kind", "budget", "scope", "window", "threshold", "spent", "limit", "at"}
    g.close()
