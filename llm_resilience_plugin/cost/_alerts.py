"""Budget alerts: tell someone when spend crosses a fraction of a day/month/total limit.

Each threshold fires once per budget, window and scope - once in this process (a bounded memo)
and once across processes (the ledger's ``mark_alert``) - as a ``budget_alert`` log line and a
call to ``on_alert``.
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


@dataclass(frozen=True, slots=True)
class BudgetAlert:
    """A budget crossed ``threshold`` (a fraction of its limit) in one window and scope."""

    budget: str
    scope: str | None
    window: str
    threshold: float
    spent: float
    limit: float
    at: float

    def to_dict(self) -> dict[str, Any]:
        """The alert as a plain dict (the ``budget_alert`` log event's payload)."""
        return {
            "budget": self.budget,
            "scope": self.scope,
            "window": self.window,
            "threshold": self.threshold,
            "spent": self.spent,
            "limit": self.limit,
            "at": self.at,
        }


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

    def fire(self, alert: BudgetAlert) -> None:
        """Log ``alert`` as ``budget_alert`` and pass it to ``on_alert`` (whose errors are logged)."""
        logger.warning(
            "budget_alert",
            extra={"llm_event_name": "budget_alert", "llm_event": alert.to_dict()},
        )
        if self.on_alert is not None:
            try:
                self.on_alert(alert)
            except Exception:
                logger.exception("on_alert callback failed")
