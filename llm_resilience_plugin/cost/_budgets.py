"""Budgets: spending limits over calendar windows, and the ledger keys each call is charged under.

Days and months are calendar-aligned in the guard's timezone; per-request and per-run budgets
are keyed by the call's ids, scoped budgets by a metadata/tag value (one limit per tenant).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from llm_resilience_plugin.cost._ledger import BudgetKey, KeyUsage, Ledger
from llm_resilience_plugin.cost._prices import is_number
from llm_resilience_plugin.errors import ConfigError

Period = Literal["request", "run", "day", "month", "total"]
_PERIODS: tuple[str, ...] = ("request", "run", "day", "month", "total")
_SCOPED_PERIODS: tuple[str, ...] = ("day", "month", "total")


@dataclass(frozen=True, slots=True)
class Budget:
    """A spending limit in dollars over a period, optionally per scope value.

    Build with :meth:`per_request`, :meth:`per_run`, :meth:`daily`, :meth:`monthly`,
    :meth:`total` or :meth:`scoped`. Days and months are calendar-aligned in the guard's
    timezone. A scoped budget applies to calls whose metadata (or tags, as ``"key:value"`` or
    ``"key=value"``) carry its key; each value (each tenant) has its own limit.
    """

    limit: float
    period: Period
    scope: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int | float):
            raise ConfigError("Budget.limit", f"must be a number of dollars, got {type(self.limit).__name__}")
        if not math.isfinite(self.limit) or self.limit <= 0:
            raise ConfigError(
                "Budget.limit",
                f"must be a positive number of dollars, got {self.limit!r} (to forbid spending, "
                "do not route to the model; to lift a limit, remove the budget)",
            )
        if self.period not in _PERIODS:
            raise ConfigError("Budget.period", f"{self.period!r} is not one of {', '.join(_PERIODS)}")
        if self.scope is not None:
            if not isinstance(self.scope, str) or not self.scope.strip():
                raise ConfigError(
                    "Budget.scope", "must be a non-empty metadata key such as 'tenant' or 'user'"
                )
            if self.period not in _SCOPED_PERIODS:
                raise ConfigError(
                    "Budget.period",
                    f"a scoped budget takes period 'day', 'month' or 'total', not {self.period!r}",
                )
        if not isinstance(self.name, str):
            raise ConfigError("Budget.name", "must be a string")
        if not self.name:
            default = (
                f"{self.scope}/{self.period}"
                if self.scope
                else {
                    "request": "per_request",
                    "run": "per_run",
                    "day": "daily",
                    "month": "monthly",
                    "total": "total",
                }[self.period]
            )
            object.__setattr__(self, "name", default)
        if "\x1f" in self.name:
            raise ConfigError("Budget.name", "must not contain control characters")

    @classmethod
    def per_request(cls, limit: float, *, name: str = "") -> Budget:
        """All attempts of one logical request (router call / LangChain LLM run)."""
        return cls(limit, "request", None, name)

    @classmethod
    def per_run(cls, limit: float, *, name: str = "") -> Budget:
        """All LLM calls under one root LangChain run (e.g. one agent run); for router calls,
        the calls sharing ``metadata={"run_id": ...}`` (else one call)."""
        return cls(limit, "run", None, name)

    @classmethod
    def daily(cls, limit: float, *, name: str = "") -> Budget:
        """A calendar-day limit (days start at midnight in the guard's timezone)."""
        return cls(limit, "day", None, name)

    @classmethod
    def monthly(cls, limit: float, *, name: str = "") -> Budget:
        """A calendar-month limit (in the guard's timezone)."""
        return cls(limit, "month", None, name)

    @classmethod
    def total(cls, limit: float, *, name: str = "") -> Budget:
        """A lifetime limit (no window)."""
        return cls(limit, "total", None, name)

    @classmethod
    def scoped(cls, key: str, limit: float, *, period: str = "day", name: str = "") -> Budget:
        """Per value of metadata/tag ``key`` (``"tenant"``, ``"user"``, ``"feature"``)."""
        return cls(limit, period, key, name)  # type: ignore[arg-type]


def check_budgets(budgets: Any) -> tuple[Budget, ...]:
    """``budgets`` as a tuple after checking it is a list of :class:`Budget` with unique names."""
    if isinstance(budgets, Budget) or not isinstance(budgets, Sequence):
        raise ConfigError("budgets", "expected a list of Budget objects, e.g. [Budget.daily(50)]")
    seen: set[str] = set()
    for b in budgets:
        if not isinstance(b, Budget):
            raise ConfigError("budgets", f"expected Budget objects (Budget.daily(50), ...), got {b!r}")
        if b.name in seen:
            raise ConfigError(
                "budgets", f"two budgets are named {b.name!r}; pass name=... to tell them apart"
            )
        seen.add(b.name)
    return tuple(budgets)


def scope_value(key: str, metadata: Mapping[str, Any] | None, tags: Iterable[str] | None) -> str | None:
    """The value of scope ``key`` for a call: ``metadata[key]``, else a ``key:value`` or
    ``key=value`` tag; None when the call does not carry it."""
    v = (metadata or {}).get(key)
    if isinstance(v, str) and v:
        return v
    if isinstance(v, int | float) and not isinstance(v, bool):
        return str(v)
    for t in tags or ():
        if isinstance(t, str) and len(t) > len(key) + 1 and t.startswith(key) and (t[len(key)] in ":="):
            return t[len(key) + 1 :]
    return None


class BudgetCalendar:
    """The guard's clock and calendar: "now" in epoch seconds and the day/month windows holding
    an instant, in one timezone, so every budget and report agrees on where a day ends."""

    def __init__(
        self, timezone: str | tzinfo = "UTC", now: Callable[[], float | datetime] | None = None
    ) -> None:
        self.tz = self._check_tz(timezone)
        if now is not None and not callable(now):
            raise ConfigError("now", "must be a callable returning epoch seconds or a datetime")
        self._now_fn = now or time.time

    @staticmethod
    def _check_tz(timezone: Any) -> tzinfo:
        if isinstance(timezone, tzinfo):
            return timezone
        if isinstance(timezone, str):
            try:
                return ZoneInfo(timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise ConfigError(
                    "timezone", f"unknown IANA timezone {timezone!r} (e.g. 'UTC', 'Europe/Paris')"
                ) from None
        raise ConfigError("timezone", "expected an IANA timezone name or a tzinfo")

    def now(self) -> float:
        """Epoch seconds from the injected clock (a naive ``datetime`` is read in the timezone)."""
        v = self._now_fn()
        if isinstance(v, datetime):
            if v.tzinfo is None:
                v = v.replace(tzinfo=self.tz)
            return v.timestamp()
        return float(v)

    def windows(self, ts: float) -> tuple[str, str]:
        """The day (``YYYY-MM-DD``) and month (``YYYY-MM``) windows holding ``ts``."""
        dt = datetime.fromtimestamp(ts, self.tz)
        return dt.date().isoformat(), f"{dt.year:04d}-{dt.month:02d}"

    def window_bounds(self, period: str, ts: float | None = None) -> tuple[float, float]:
        """Start and end (epoch seconds) of the ``"day"`` or ``"month"`` window holding ``ts``."""
        dt = datetime.fromtimestamp(self.now() if ts is None else ts, self.tz)
        if period == "day":
            start = dt.date()
            end = start + timedelta(days=1)
        elif period == "month":
            start = date(dt.year, dt.month, 1)
            end = date(dt.year + (dt.month == 12), dt.month % 12 + 1, 1)
        else:
            raise ConfigError("period", "window_bounds takes 'day' or 'month'")
        return (
            datetime.combine(start, datetime.min.time(), self.tz).timestamp(),
            datetime.combine(end, datetime.min.time(), self.tz).timestamp(),
        )


class BudgetSet:
    """The guard's budgets on its calendar: the ledger keys each call is charged under, and what
    those budgets have used so far in their current windows."""

    def __init__(self, budgets: tuple[Budget, ...], calendar: BudgetCalendar, reservation_ttl: float) -> None:
        self.budgets = budgets
        self.calendar = calendar
        if not is_number(reservation_ttl) or reservation_ttl <= 0:
            raise ConfigError("reservation_ttl", "must be a positive number of seconds")
        self.reservation_ttl = float(reservation_ttl)

    def keys(
        self,
        ts: float,
        metadata: Mapping[str, Any] | None,
        tags: Iterable[str] | None,
        request_id: str,
        run_id: str | None,
    ) -> tuple[list[BudgetKey], dict[str, str]]:
        """The keys a call at ``ts`` is charged under - one per budget that applies - and the
        scope values it carries. A scoped budget whose key the call lacks does not apply."""
        day, month = self.calendar.windows(ts)
        # A request's key lives as long as its call can (no deadline outlasts reservation_ttl),
        # renewed by each attempt; a run spans many calls, so its key is kept a day.
        per_request = ts + self.reservation_ttl
        keep = ts + max(86400.0, 2 * self.reservation_ttl)
        keys: list[BudgetKey] = []
        scopes: dict[str, str] = {}
        tags = list(tags or ())
        for b in self.budgets:
            if b.period == "request":
                keys.append(BudgetKey(b.name, f"request={request_id}", "request", b.limit, per_request))
                continue
            if b.period == "run":
                keys.append(BudgetKey(b.name, f"run={run_id or request_id}", "run", b.limit, keep))
                continue
            window = {"day": day, "month": month, "total": "all"}[b.period]
            scope = ""
            if b.scope is not None:
                value = scope_value(b.scope, metadata, tags)
                if value is None:
                    continue  # the budget does not apply to calls without that key
                scopes[b.scope] = value
                scope = f"{b.scope}={value}"
            keys.append(BudgetKey(b.name, scope, window, b.limit))
        return keys, scopes

    def usage(
        self,
        ledger: Ledger,
        metadata: Mapping[str, Any] | None,
        tags: Iterable[str] | None,
        request_id: str | None,
        run_id: str | None,
    ) -> list[KeyUsage]:
        """Usage now of every budget that applies to a call with this metadata/tags (per-request
        and per-run budgets only when their id is given)."""
        keys, _ = self.keys(self.calendar.now(), metadata, tags, request_id or "", run_id)
        keys = [
            k
            for k in keys
            if (k.window != "request" or request_id is not None) and (k.window != "run" or run_id is not None)
        ]
        return ledger.usage(keys)

    def window_usage(self, ledger: Ledger) -> list[KeyUsage]:
        """Every day/month/total budget's usage in its current window (a scoped budget: one row
        per scope value the ledger saw there); per-request and per-run budgets are skipped."""
        day, month = self.calendar.windows(self.calendar.now())
        rows: list[KeyUsage] = []
        for b in self.budgets:
            if b.period in ("request", "run"):
                continue
            window = {"day": day, "month": month, "total": "all"}[b.period]
            if b.scope is None:
                rows.extend(ledger.usage([BudgetKey(b.name, "", window, b.limit)]))
            else:
                rows.extend(ledger.list_usage(budget=b.name, window=window))
        return rows
