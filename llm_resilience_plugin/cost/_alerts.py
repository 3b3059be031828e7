"""Budget alerts: tell someone when spend crosses a fraction of a day/month/total limit, or
when a provider bills more output than the request allowed.

Each threshold fires once per budget, window and scope - once in this process (a bounded memo)
and once across processes (the ledger's ``mark_alert``) - as a ``budget_alert`` log line and a
call to ``on_alert``. An overrun (more completion tokens billed than the request's
``max_tokens``) fires once per attempt as a ``budget_overrun`` log line and a call to
``on_alert`` with ``kind="budget_overrun"``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from llm_resilience_plugin.cost._ledger import BudgetKey, KeyUsage, Ledger
from llm_resilience_plugin.cost._prices import is_number
from llm_resilience_plugin.errors import ConfigError

logger = logging.getLogger("llm_resilience.cost")

_MAX_REMEMBERED = 10_000


THRESHOLD = "threshold"
OVERRUN = "budget_overrun"


@dataclass(frozen=True, slots=True)
class BudgetAlert:
    """A budget crossed ``threshold`` (a fraction of its limit) in one window and scope
    (``kind="threshold"``), or an attempt was billed more completion tokens than its request's
    ``max_tokens`` allowed (``kind="budget_overrun"``: ``deployment_id``, ``max_tokens``
    requested, ``completion_tokens`` billed, its ``cost`` against the ``estimate`` reserved; the
    budget fields then describe the tightest budget it was charged to, ``threshold`` is 0)."""

    budget: str
    scope: str | None
    window: str
    threshold: float
    spent: float
    limit: float
    at: float
    kind: str = THRESHOLD
    deployment_id: str | None = None
    model: str | None = None
    request_id: str | None = None
    max_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    estimate: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The alert as a plain dict (the ``budget_alert`` / ``budget_overrun`` log payload)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "budget": self.budget,
            "scope": self.scope,
            "window": self.window,
            "threshold": self.threshold,
            "spent": self.spent,
            "limit": self.limit,
            "at": self.at,
        }
        if self.kind != THRESHOLD:
            out.update(
                deployment_id=self.deployment_id,
                model=self.model,
                request_id=self.request_id,
                max_tokens=self.max_tokens,
                completion_tokens=self.completion_tokens,
                cost=self.cost,
                estimate=self.estimate,
            )
        return out


@dataclass(frozen=True, slots=True)
class Overrun:
    """One attempt billed beyond its request's output limit (what the overrun alert names)."""

    deployment_id: str | None
    model: str | None
    request_id: str | None
    max_tokens: int
    completion_tokens: int
    cost: float
    estimate: float


class BudgetAlerts:
    """The guard's alerting: which thresholds to watch, who to tell, and which alerts already
    fired (so a busy budget over 80% alerts once per window, not on every call)."""

    def __init__(
        self,
        alert_at: float | Sequence[float] | None = 0.8,
        on_alert: Callable[[BudgetAlert], Any] | None = None,
    ) -> None:
        self.thresholds: tuple[float, ...] = self._check_alert_at(alert_at)
        if on_alert is not None and not callable(on_alert):
            raise ConfigError("on_alert", "must be a callable taking a BudgetAlert")
        self.on_alert = on_alert
        self._lock = threading.Lock()
        self._alerted: OrderedDict[tuple[str, float], None] = OrderedDict()

    @staticmethod
    def _check_alert_at(alert_at: Any) -> tuple[float, ...]:
        if alert_at is None:
            return ()
        values = [alert_at] if not isinstance(alert_at, list | tuple) else list(alert_at)
        for v in values:
            if not is_number(v) or not 0 < v <= 1:
                raise ConfigError("alert_at", f"thresholds are fractions of a limit in (0, 1], got {v!r}")
        return tuple(sorted({float(v) for v in values}))

    def check(
        self,
        keys: Iterable[BudgetKey],
        usages: Iterable[KeyUsage],
        *,
        ledger: Ledger,
        now: Callable[[], float],
    ) -> None:
        """Fire every threshold the settled ``usages`` of a reservation's ``keys`` crossed for the
        first time (``ledger`` remembers across processes, ``now`` stamps the alert)."""
        if not self.thresholds:
            return
        by_id = {k.id: k for k in keys}
        for u in usages:
            key = by_id.get(BudgetKey(u.budget, u.scope, u.window, u.limit).id)
            if key is None or u.limit <= 0 or key.window in ("request", "run"):
                continue  # alerts are for calendar/total windows, not for each request or run
            for threshold in self.thresholds:
                if u.spent < threshold * u.limit - 1e-12:
                    break
                marker = (key.id, threshold)
                with self._lock:
                    if marker in self._alerted:
                        continue
                    self._alerted[marker] = None
                    while len(self._alerted) > _MAX_REMEMBERED:
                        self._alerted.popitem(last=False)
                if ledger.mark_alert(key, threshold):  # once across processes too
                    self.fire(
                        BudgetAlert(
                            budget=u.budget,
                            scope=u.scope or None,
                            window=u.window,
                            threshold=threshold,
                            spent=u.spent,
                            limit=u.limit,
                            at=now(),
                        )
                    )

    def overrun(self, over: Overrun, usages: Sequence[KeyUsage], at: float) -> BudgetAlert:
        """Fire a ``budget_overrun`` alert for ``over`` (always: thresholds play no part), naming
        the tightest budget of ``usages`` it was charged to; returns the alert."""
        tight = min(usages, key=lambda u: u.remaining, default=None)
        alert = BudgetAlert(
            budget=tight.budget if tight is not None else "",
            scope=(tight.scope or None) if tight is not None else None,
            window=tight.window if tight is not None else "",
            threshold=0.0,
            spent=tight.spent if tight is not None else over.cost,
            limit=tight.limit if tight is not None else 0.0,
            at=at,
            kind=OVERRUN,
            deployment_id=over.deployment_id,
            model=over.model,
            request_id=over.request_id,
            max_tokens=over.max_tokens,
            completion_tokens=over.completion_tokens,
            cost=over.cost,
            estimate=over.estimate,
        )
        self.fire(alert)
        return alert

    def fire(self, alert: BudgetAlert) -> None:
        """Log ``alert`` once (as ``budget_alert``, or its ``kind``) and pass it to ``on_alert``
        (whose errors are logged)."""
        name = "budget_alert" if alert.kind == THRESHOLD else alert.kind
        logger.warning(name, extra={"llm_event_name": name, "llm_event": alert.to_dict()})
        if self.on_alert is not None:
            try:
                self.on_alert(alert)
            except Exception:
                logger.exception("on_alert callback failed")
